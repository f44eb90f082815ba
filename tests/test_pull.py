"""`edgeinfer pull REPO[:QUANT]` and `--model REPO[:QUANT]` against a loopback fake of the Hub (tests/fakehub.py).

Each test runs `edgeinfer` in a subprocess with HF_ENDPOINT at the fake and HF_HOME in its own tmp_path, so
huggingface_hub reads them itself as it would for a user. The fake serves the default model's bytes under a
few repo and file names, a two-part split of it (written with gguf's GGUFWriter, as llama.cpp's gguf-split
names the parts), a truncated copy, and gated repos.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gguf
import pytest

from edgeinfer.errors import HubNotFoundError
from edgeinfer.models.files import quant_of
from edgeinfer.models.hub import HubRef, choose, parse_ref

from . import gate
from .conftest import rewrite_gguf
from .fakehub import FakeHub

pytestmark = pytest.mark.model

EDGEINFER = str(Path(sys.executable).parent / "edgeinfer")
REPO = "test/SmolLM2-135M-Instruct-GGUF"
FILE = "SmolLM2-135M-Instruct-Q4_1.gguf"
SPLIT = "test/SmolLM2-split-GGUF"
PARTS = ("SmolLM2-135M-Instruct-Q4_1-00001-of-00002.gguf", "SmolLM2-135M-Instruct-Q4_1-00002-of-00002.gguf")
GEN = ["--max-tokens", "8", "--temperature", "0", "-p", "1", "-c", "512"]


def split_copy(src: Path, dst: Path) -> list[Path]:
    """The GGUF at src rewritten as two parts, dst's stem + -0000k-of-00002.gguf (gguf's writer adds the
    split.no / split.count / split.tensors.count keys llama.cpp reads, as gguf-split does)."""
    rewrite_gguf(src, dst, split_max_tensors=len(gguf.GGUFReader(src).tensors) // 2 + 1)
    return sorted(dst.parent.glob(f"{dst.stem}-*-of-*.gguf"))


@pytest.fixture(scope="module")
def source(model_path):
    return model_path.read_bytes()


@pytest.fixture(scope="module")
def hub(source, model_path, tmp_path_factory):
    parts = split_copy(model_path, tmp_path_factory.mktemp("split") / "SmolLM2-135M-Instruct-Q4_1.gguf")
    assert [p.name for p in parts] == list(PARTS)
    with FakeHub() as fake:
        fake.add(REPO, {"README.md": b"# test\n", FILE: source, "SmolLM2-135M-Instruct-Q8_0.gguf": source})
        fake.add(REPO, {"mmproj-SmolLM2-F16.gguf": b"GGUF not a model"})
        fake.add(SPLIT, {p.name: p.read_bytes() for p in parts})
        fake.add("test/cut-GGUF", {"SmolLM2-Q4_1.gguf": source[: len(source) // 2]})
        fake.add("test/gated-GGUF", {FILE: source})
        fake.add("test/forbidden-GGUF", {FILE: source})
        fake.gated.update({"test/gated-GGUF": 401, "test/forbidden-GGUF": 403})
        # A catalog entry's repo (models/catalog.toml: repo and quant), served with the default model's bytes.
        qwen = {"qwen2.5-0.5b-instruct-q4_k_m.gguf": source, "qwen2.5-0.5b-instruct-q8_0.gguf": source}
        fake.add("Qwen/Qwen2.5-0.5B-Instruct-GGUF", qwen)
        yield fake


def env_for(home: Path, hub: FakeHub, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return env | {"HF_HOME": str(home), "HF_ENDPOINT": hub.url} | extra


def edgeinfer(home: Path, hub: FakeHub, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [EDGEINFER, *args], env=env_for(home, hub, **extra), capture_output=True, text=True, timeout=300
    )


def leftovers(home: Path) -> list[Path]:
    """Partial downloads anywhere in the cache."""
    return list(home.rglob("*.incomplete"))


def assert_one_line_error(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for word in words:
        assert word in lines[0], lines[0]


def assert_nothing_passes_as_complete(home: Path, hub: FakeHub, name: str) -> None:
    """Offline, NAME resolves only from the cache: it must not, and no partial file may be left."""
    assert leftovers(home) == []
    before = len(hub.log)
    offline = edgeinfer(home, hub, "pull", name, HF_HUB_OFFLINE="1")
    assert_one_line_error(offline, "HF_HUB_OFFLINE")
    assert len(hub.log) == before


def assert_default_greedy(result: subprocess.CompletedProcess[str]) -> None:
    """The generate run wrote the default model's greedy answer to "Hi" (the pulled file is its copy)."""
    assert result.returncode == 0 and result.stdout.strip(), result.stderr
    gate.follows_greedy(result.stdout.removesuffix("\n"), [{"role": "user", "content": "Hi"}], 8)


def test_pull_is_byte_identical_and_a_second_run_sends_no_request(tmp_path, hub, source):
    first = edgeinfer(tmp_path, hub, "pull", REPO)
    assert first.returncode == 0, first.stderr
    path = Path(first.stdout.strip())
    assert path.name == FILE  # no QUANT: Q4_1 comes before Q8_0 in the preference order; mmproj is skipped
    assert path.read_bytes() == source
    assert path.is_relative_to(tmp_path / "hub")  # the standard cache under HF_HOME
    before = len(hub.log)
    for name in (REPO, f"{REPO}:q4_1", f"hf.co/{REPO}:Q4_1", f"https://huggingface.co/{REPO}"):
        again = edgeinfer(tmp_path, hub, "pull", name)
        assert again.returncode == 0 and Path(again.stdout.strip()) == path, again.stderr
        assert "already in the cache" in again.stderr
    assert len(hub.log) == before  # resolved from the cache: no request at all
    offline = edgeinfer(tmp_path, hub, "pull", f"{REPO}:Q4_1", HF_HUB_OFFLINE="1")
    assert offline.returncode == 0 and Path(offline.stdout.strip()) == path
    assert leftovers(tmp_path) == []


def test_pull_shows_a_progress_bar(tmp_path, hub):
    # huggingface_hub draws its bar on a terminal only; TQDM_POSITION=-1 is its switch to draw it anyway.
    result = edgeinfer(tmp_path, hub, "pull", f"{REPO}:Q4_1", TQDM_POSITION="-1")
    assert result.returncode == 0, result.stderr
    assert f"{FILE}: 100%" in result.stderr and "98.4M/98.4M" in result.stderr, result.stderr[-500:]


def test_a_cut_connection_resumes_with_a_range_request(tmp_path, hub, source):
    hub.cut_after[FILE] = 30_000_000
    start = len(hub.log)
    result = edgeinfer(tmp_path, hub, "pull", f"{REPO}:Q4_1")
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).read_bytes() == source
    gets = [r for r in hub.log[start:] if r.method == "GET" and r.path.endswith(FILE)]
    assert len(gets) == 2 and "Range" not in gets[0].headers, gets
    resumed_at = int(gets[1].headers["Range"].removeprefix("bytes=").removesuffix("-"))
    assert 0 < resumed_at <= 30_000_000
    assert leftovers(tmp_path) == []


def test_ctrl_c_stops_at_once_and_a_second_pull_completes(tmp_path, hub, source):
    hub.hold_after = hub.bytes_sent + 10_000_000  # the download stops there until released: mid-download
    hub.release.clear()
    try:
        proc = subprocess.Popen(
            [EDGEINFER, "pull", f"{REPO}:Q8_0"],
            env=env_for(tmp_path, hub),
            stderr=subprocess.PIPE,
            text=True,
            # Ctrl-C as at a terminal: a suite started in the background (`cmd &` without job control, nohup)
            # ignores SIGINT, its children inherit that, and the pull would rightly go on (seen: exit 0, a hang).
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        deadline = time.monotonic() + 120
        while hub.bytes_sent < hub.hold_after and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert proc.poll() is None and hub.bytes_sent >= hub.hold_after, "the pull did not get mid-download"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        hub.hold_after = None
        hub.release.set()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("edgeinfer: pull of"), err
    assert "interrupted" in err
    assert_nothing_passes_as_complete(tmp_path, hub, f"{REPO}:Q8_0")
    again = edgeinfer(tmp_path, hub, "pull", f"{REPO}:Q8_0")
    assert again.returncode == 0, again.stderr
    assert Path(again.stdout.strip()).read_bytes() == source
    assert leftovers(tmp_path) == []


def test_a_damaged_cached_file_is_fetched_again(tmp_path, hub, source):
    first = edgeinfer(tmp_path, hub, "pull", REPO)
    assert first.returncode == 0, first.stderr
    path = Path(first.stdout.strip())
    blob = path.resolve()
    blob.write_bytes(source[: len(source) // 3])  # damaged on disk after the pull
    again = edgeinfer(tmp_path, hub, "pull", REPO)
    assert again.returncode == 0 and "pulled" in again.stderr, again.stderr
    assert Path(again.stdout.strip()).read_bytes() == source


@pytest.mark.parametrize(
    "name, words",
    [
        ("test/no-such-GGUF", ["test/no-such-GGUF", "no such", "HF_TOKEN"]),
        (f"{REPO}:Q5_K_M", ["no Q5_K_M GGUF", "it has Q4_1, Q8_0"]),
        ("test/cut-GGUF", ["SmolLM2-Q4_1.gguf", "truncated", "removed"]),
        ("test/gated-GGUF:Q4_1", ["gated", "HF_TOKEN"]),
        ("test/forbidden-GGUF", ["gated", "HF_TOKEN"]),
    ],
)
def test_pull_errors_are_one_line_and_leave_nothing_complete(tmp_path, hub, name, words):
    result = edgeinfer(tmp_path, hub, "pull", name)
    assert_one_line_error(result, *words)
    assert_nothing_passes_as_complete(tmp_path, hub, name)
    if "cut" in name:
        assert list(tmp_path.rglob("blobs/*")) == [], "the truncated blob stays in the cache"


def test_hf_token_opens_a_gated_repo(tmp_path, hub, source):
    start = len(hub.log)
    result = edgeinfer(tmp_path, hub, "pull", "test/gated-GGUF", HF_TOKEN="hf_fake_token")
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).read_bytes() == source
    assert all(r.headers.get("authorization") == "Bearer hf_fake_token" for r in hub.log[start:] if "gated" in r.path)


def test_hf_hub_cache_is_where_files_go(tmp_path, hub):
    result = edgeinfer(tmp_path / "home", hub, "pull", f"{REPO}:Q4_1", HF_HUB_CACHE=str(tmp_path / "elsewhere"))
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).is_relative_to(tmp_path / "elsewhere")
    assert not (tmp_path / "home" / "hub").exists()


def test_a_catalog_name_is_pullable(tmp_path, hub, source):
    models = {"EDGEINFER_MODELS": str(tmp_path / "models")}  # not in edgeinfer's own models folder
    result = edgeinfer(tmp_path, hub, "pull", "qwen2.5-0.5b-instruct-q8_0", **models)
    assert result.returncode == 0, result.stderr
    path = Path(result.stdout.strip())
    assert path.name == "qwen2.5-0.5b-instruct-q8_0.gguf" and path.read_bytes() == source  # the entry's quant
    before = len(hub.log)
    show = edgeinfer(tmp_path, hub, "models", "show", "qwen2.5-0.5b-instruct-q8_0", **models)
    assert show.returncode == 0, show.stderr
    gate.contains(show.stdout, "llama")
    assert len(hub.log) == before


def test_unreachable_hub_is_a_one_line_error(tmp_path, hub):
    result = edgeinfer(tmp_path, hub, "pull", REPO, HF_ENDPOINT="http://127.0.0.1:9")
    assert_one_line_error(result, "cannot reach the Hub", "HF_ENDPOINT")


def test_model_option_with_an_unknown_repo_is_a_one_line_error(tmp_path, hub):
    result = edgeinfer(tmp_path, hub, "generate", "--model", "test/no-such-GGUF:Q4_0", "Hi", *GEN)
    assert_one_line_error(result, "test/no-such-GGUF", "no such")


def test_model_option_pulls_on_first_use_then_runs(tmp_path, hub, source):
    result = edgeinfer(tmp_path, hub, "generate", "--model", f"{REPO}:Q4_1", "Hi", *GEN)
    assert_default_greedy(result)
    cached = list(tmp_path.rglob(f"snapshots/*/{FILE}"))
    assert len(cached) == 1 and cached[0].read_bytes() == source
    before = len(hub.log)
    again = edgeinfer(tmp_path, hub, "generate", "--model", f"{REPO}:Q4_1", "Hi", *GEN)
    assert_default_greedy(again)
    assert len(hub.log) == before


def test_a_split_gguf_pulls_whole_and_loads_from_its_first_part(tmp_path, hub):
    result = edgeinfer(tmp_path, hub, "pull", f"{SPLIT}:Q4_1")
    assert result.returncode == 0, result.stderr
    first = Path(result.stdout.strip())
    assert first.name == PARTS[0] and (first.parent / PARTS[1]).is_file()
    assert "98 MB in 2 parts" in result.stderr
    for name in PARTS:
        assert (first.parent / name).read_bytes() == hub.repos[SPLIT][name]
    run = edgeinfer(tmp_path, hub, "generate", "--model", SPLIT, "Hi", *GEN, HF_HUB_OFFLINE="1")
    assert_default_greedy(run)


@pytest.mark.pure
@pytest.mark.parametrize(
    "value, ref",
    [
        ("owner/repo", HubRef("owner/repo")),
        ("owner/repo:Q4_K_M", HubRef("owner/repo", "Q4_K_M")),
        ("hf.co/owner/repo:q8_0", HubRef("owner/repo", "q8_0")),
        ("https://huggingface.co/owner/repo-GGUF", HubRef("owner/repo-GGUF")),
        ("https://huggingface.co/o/r/resolve/main/r-Q4_0.gguf", HubRef("o/r", None, "r-Q4_0.gguf")),
        ("model.gguf", None),
        ("dir/model.gguf", None),
        ("./a/b", None),
        ("/abs/a", None),
        ("~/a/b", None),
        ("a/b/c", None),
        ("qwen2.5:0.5b", None),
    ],
)
def test_parse_ref(value, ref):
    assert parse_ref(value) == ref


FILES = [
    "README.md",
    "m-Q8_0.gguf",
    "m-Q4_K_M.gguf",
    "m-q4_0.gguf",
    "mmproj-m-F16.gguf",
    "big-Q2_K-00002-of-00002.gguf",
    "big-Q2_K-00001-of-00002.gguf",
    "m-IQ2_XXS.gguf",
    "m-UD-Q4_K_XL.gguf",
]


@pytest.mark.pure
@pytest.mark.parametrize(
    "quant, files",
    [
        (None, ("m-Q4_K_M.gguf",)),
        ("q4_0", ("m-q4_0.gguf",)),
        ("Q4_K", ("m-Q4_K_M.gguf",)),
        ("iq2_xxs", ("m-IQ2_XXS.gguf",)),
        ("Q2_K", ("big-Q2_K-00001-of-00002.gguf", "big-Q2_K-00002-of-00002.gguf")),
    ],
)
def test_choose_by_quant_and_preference(quant, files):
    assert choose(HubRef("o/r", quant), FILES).files == files


@pytest.mark.pure
def test_a_missing_quant_lists_those_the_repo_has():
    with pytest.raises(HubNotFoundError) as e:
        choose(HubRef("o/r", "F16"), FILES)  # only the mmproj file is F16, and it is skipped
    assert "o/r has no F16 GGUF; it has Q4_K_M, Q4_0, Q8_0, Q2_K, IQ2_XXS, Q4_K_XL" in str(e.value)
    assert quant_of("qwen2.5-1.5b-instruct-q4_k_m.gguf") == "Q4_K_M"
