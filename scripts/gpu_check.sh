#!/usr/bin/env bash
# The whole GPU check on a machine with an NVIDIA GPU, in one go: the CUDA build of llama.cpp in .venv,
# edgeinfer's engine bench at 1/4/16 streams, then edgeinfer against a CUDA llama-server, written to one JSON.
#
#   scripts/gpu_check.sh [OUT.json]            (default: gpu-check.json in the current folder)
#
# OUT.json holds: the GPU(s) by nvidia-smi (name, memory, driver, compute capability), ggml's devices,
# the commit (and how many files differ from it), the wheel's CMake flags and cache folder, the
# llama-server used and how it was told to offload, the seconds of each phase, the processes seen on
# the GPU during the benches, a summary (warm aggregate tok/s per target and level), and the two full
# reports: `edgeinfer bench --json` (docs/bench-schema.json) and scripts/vs_llama_server.py's --json.
# Logs go to a temporary folder, named at the start and the end.
#
# Time budget: 10 minutes; about 5 once both CUDA builds are cached (each phase's share is noted at the
# phase). The first run on a fresh machine compiles llama.cpp's CUDA kernels twice, for the wheel and for
# llama-server (one architecture each, on all cores), and may take longer; the second takes both builds.
#
# Environment:
#   CUDA_ARCHITECTURES  what nvcc compiles for (default: the GPUs' own, from nvidia-smi, e.g. 90-real
#                       for an H100/H200; where nvidia-smi reports none, scripts/cuda_toolchain.sh's list)
#   LLAMA_SERVER_DIR    where llama-server is built or taken from (default: one folder per CMake flag set
#                       under ~/.cache/edgeinfer); an existing DIR/bin/llama-server is taken as it is
#
# The wheel is built with CUDA only (make install CUDA=1 VULKAN=0): with Vulkan as well, ggml would list
# the same card twice (CUDA0 and Vulkan0) and split the layers across the two.
#
# Offline (no package index): everything pip would fetch must already be here, and the script says which
# piece is missing. Copy, from a machine with an index where this script (or the make line below) ran as
# a user with the same home folder, since the wheel's cache key holds the toolkit's path:
#   ~/.cache/edgeinfer/cuda-13/           NVIDIA's compiler, runtime and cuBLAS (about 1.1 GB)
#   ~/.cache/edgeinfer/wheels/<key>/      the CUDA wheel: CUDA_ARCHITECTURES=90-real make install CUDA=1 VULKAN=0
#                                         (building it needs no GPU; the script prints the <key> it wants)
#   .venv/                                the virtualenv with edgeinfer's dependencies (same Python, same path)
#   ~/.cache/edgeinfer/llama-server-cuda-<key>/   a built llama-server, or at least its src/ folder
set -euo pipefail

t0=$SECONDS
say() { printf '[%4ds] %s\n' "$((SECONDS - t0))" "$*" >&2; }
die() {
  printf 'gpu_check: %s\n' "$*" >&2
  exit 1
}

out=$(realpath -m "${1:-gpu-check.json}") # resolved before the cd below: relative to the caller's folder
[ -d "$(dirname "$out")" ] || die "$(dirname "$out") does not exist; create it or name another OUT.json"
cd "$(dirname "$(realpath "$0")")/.."

cache=${XDG_CACHE_HOME:-$HOME/.cache}/edgeinfer
toolkit=$cache/cuda-13/nvidia/cu13 # where scripts/cuda_toolchain.sh lays NVIDIA's wheels out
py=.venv/bin/python
work=$(mktemp -d -t edgeinfer-gpu-check.XXXXXX)
say "logs in $work"

phase='' phase_t=0
: >"$work/phases.tsv"
phase_start() {
  phase=$1 phase_t=$SECONDS
  say "== $phase: $2"
}
phase_end() {
  printf '%s\t%s\n' "$phase" "$((SECONDS - phase_t))" >>"$work/phases.tsv"
  say "== $phase: done in $((SECONDS - phase_t)) s"
}

# GPU processes, sampled while the benches run: evidence that each server really sits on the GPU
# (vs_llama_server.py keeps the servers' own logs in a folder it deletes).
sampler=
start_sampler() {
  while :; do
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits 2>/dev/null || true
    sleep 3
  done >>"$1" &
  sampler=$!
}
stop_sampler() {
  if [ -n "$sampler" ]; then
    kill "$sampler" 2>/dev/null || true
    wait "$sampler" 2>/dev/null || true
    sampler=
  fi
}
trap stop_sampler EXIT

# The Makefile's own values for a CUDA install (the wheel's flags, cache folder, install stamp), so this
# script holds no copy of its key logic. Call it only once the toolkit is in place: make runs
# scripts/cuda_toolchain.sh while it reads the Makefile, and a failed toolkit install there would leave
# the flags without CUDA, silently.
make_var() {
  # shellcheck disable=SC2016  # $($*) is make's, not the shell's
  make -s --no-print-directory CUDA=1 VULKAN=0 --eval 'print-%: ; @echo $($*)' "print-$1"
}

# --- preflight (seconds; the index probe gives up after 30) ------------------------------------------
phase_start preflight "what this machine has"
problems=()
problem() { problems+=("$1"); }

if ! command -v nvidia-smi >/dev/null; then
  problem "nvidia-smi not found: install NVIDIA's driver (the CUDA toolkit itself comes from PyPI, scripts/cuda_toolchain.sh)"
elif ! nvidia-smi -L >"$work/nvidia-smi-L.txt" 2>&1; then
  problem "nvidia-smi fails ($(head -1 "$work/nvidia-smi-L.txt")): the driver is not loaded or sees no GPU"
fi
for tool in make cmake g++; do
  command -v "$tool" >/dev/null || problem "$tool not found: install it (Debian: apt-get install build-essential cmake)"
done

# make install's virtualenv, made here first (as the Makefile would) so that pip is at hand for the probe
# and for scripts/cuda_toolchain.sh.
if [ ! -x "$py" ]; then
  sys_py=$(command -v python3.11 || command -v python3 || true)
  if [ -z "$sys_py" ] || ! "$sys_py" -c 'import sys, ensurepip, venv; assert sys.version_info >= (3, 11)' 2>/dev/null; then
    problem "no .venv and no Python >= 3.11 with venv to make one: install it (Debian: apt-get install python3 python3-venv)"
  else
    say "making .venv with $sys_py"
    "$sys_py" -m venv .venv
  fi
fi

online=0
if [ -x "$py" ] && timeout 30 "$py" -m pip index versions llama-cpp-python --disable-pip-version-check \
  --timeout 10 --retries 0 >"$work/index-probe.log" 2>&1; then
  online=1
fi
say "package index: $([ "$online" = 1 ] && echo reachable || echo "not reachable (offline: nothing is fetched)")"

if [ "$online" = 0 ] && [ ! -x "$toolkit/bin/nvcc" ]; then
  problem "no package index and no CUDA toolchain in $cache/cuda-13: copy that folder there from a machine where scripts/cuda_toolchain.sh ran (about 1.1 GB)"
fi

if command -v nvidia-smi >/dev/null && [ -z "${CUDA_ARCHITECTURES:-}" ]; then
  # 9.0 -> 90-real: machine code for these GPUs only, the shortest compile.
  archs=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | sort -u |
    sed -n 's/^ *\([0-9]\{1,2\}\)\.\([0-9]\) *$/\1\2-real/p' | paste -sd ';' || true)
  if [ -n "$archs" ]; then
    export CUDA_ARCHITECTURES=$archs
  else
    say "nvidia-smi reports no compute capability: compiling for scripts/cuda_toolchain.sh's default list"
  fi
fi
say "CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES:-"(the default of scripts/cuda_toolchain.sh)"}"

# Offline, every piece pip would fetch must be here already; online, make and the build scripts fetch them.
server_src=
if [ "$online" = 0 ] && [ -x "$toolkit/bin/nvcc" ] && [ -x "$py" ]; then
  cuda_args=$(scripts/cuda_toolchain.sh --cmake-args)
  wheels=$(make_var WHEELS)
  stamp=$(make_var STAMP)
  version=$(make_var LLAMA_CPP_PYTHON)
  # The installed distribution, not the source folder that python -c finds in the current folder.
  "$py" -c 'import importlib.metadata as m, click, httpx, openai; m.version("edgeinfer")' 2>/dev/null ||
    problem "no package index and .venv lacks edgeinfer's dependencies: copy a .venv made by make install (same Python, same path), or give pip an index (PIP_INDEX_URL)"
  if [ ! -e "$stamp" ] && ! compgen -G "$wheels/llama_cpp_python-*.whl" >/dev/null; then
    problem "no package index and no CUDA wheel in $wheels: build it with an index (CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES:-<default>} make install CUDA=1 VULKAN=0, no GPU needed, same home folder) and copy that folder here"
  fi
  server_dir=${LLAMA_SERVER_DIR:-$cache/llama-server-cuda-$(printf %s "$cuda_args" | md5sum | cut -c1-10)}
  if [ ! -x "$server_dir/bin/llama-server" ] && [ ! -d "$server_dir/src/llama_cpp_python-$version" ]; then
    server_src=$(compgen -G "$cache/llama-server*/src/llama_cpp_python-$version" | head -1 || true)
    [ -n "$server_src" ] ||
      problem "no package index and no llama.cpp source for llama-server: copy $server_dir/bin (a built llama-server) or the unpacked llama_cpp_python-$version sdist into $server_dir/src/"
  fi
fi

if [ "${#problems[@]}" -gt 0 ]; then
  printf 'gpu_check: %s\n' "${problems[@]}" >&2
  exit 1
fi
phase_end

# --- toolchain: 0 s when ~/.cache/edgeinfer/cuda-13 is there, 1-2 min to fetch its 1.1 GB -------------
phase_start toolchain "scripts/cuda_toolchain.sh --cmake-args"
cuda_args=$(PYTHON=$py scripts/cuda_toolchain.sh --cmake-args)
say "CUDA flags: $cuda_args"
phase_end

# --- install: about 30 s with the wheel cached (0 with this build installed); its first build compiles --
# --- ggml's CUDA kernels, several minutes even for one architecture on 16 cores --------------------------
phase_start install "make install CUDA=1 VULKAN=0"
cmake_flags=$(make_var CMAKE_FLAGS)
wheels=$(make_var WHEELS)
stamp=$(make_var STAMP)
version=$(make_var LLAMA_CPP_PYTHON)
case " $cmake_flags " in
*" -DGGML_CUDA=ON "*) ;;
*) die "the Makefile's flags for CUDA=1 hold no -DGGML_CUDA=ON ($cmake_flags): see scripts/cuda_toolchain.sh" ;;
esac
say "wheel flags: $cmake_flags"
say "wheel cache: $wheels"
if [ "$online" = 1 ]; then
  make install CUDA=1 VULKAN=0 2>&1 | tee "$work/install.log" ||
    die "make install CUDA=1 VULKAN=0 failed; its output: $work/install.log (the wheel build's own log sits beside $wheels)"
elif [ -e "$stamp" ]; then
  # Not make: it would run the whole recipe, pip's index steps included, whenever pyproject.toml or
  # scripts/build_llama_wheel.py is newer than the stamp.
  say ".venv already holds this build ($stamp)"
else
  # The two steps of make install's recipe that need no index: the cached wheel in place of the installed
  # llama-cpp-python (edgeinfer and its dependencies are already in .venv). The old stamps go, so that the
  # next make install, whatever its flags, installs again rather than trust a build this replaced.
  "$py" -m pip install -q --no-deps --force-reinstall --no-index --find-links "$wheels" "llama-cpp-python==$version"
  rm -f .venv/.installed-*
  say "installed the cached wheel from $wheels without an index; run make install CUDA=1 VULKAN=0 with an index to finish the install"
fi
phase_end

# --- gpu: seconds. The wheel must list a CUDA device, or every figure after this is the CPU's ------------
phase_start gpu "ggml's devices (edgeinfer.engine.offload.local_gpus)"
devices=$("$py" -c "from edgeinfer.engine.offload import local_gpus; print(local_gpus())" 2>"$work/gpu.log") ||
  die "listing ggml's devices failed: $work/gpu.log"
say "local_gpus(): $devices"
if [[ $devices != *"name='CUDA"* ]]; then
  lib=$("$py" -c "import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec('llama_cpp').origin).parent / 'lib')")
  if [ ! -e "$lib/libggml-cuda.so" ]; then
    die "no CUDA device: the installed llama.cpp has no CUDA backend ($lib/libggml-cuda.so is missing); rm -rf $wheels and run again"
  fi
  missing=$(ldd "$lib/libggml-cuda.so" | grep 'not found' | tr -s ' \t' ' ' | paste -sd ',' || true)
  die "no CUDA device listed although $lib/libggml-cuda.so is there${missing:+; its libraries not found:$missing (try LD_LIBRARY_PATH=$toolkit/lib)}; check nvidia-smi and the driver's libcuda.so.1"
fi
phase_end

# --- bench: about 1 min (3 levels x 2 targets, spec auto and spec off, one cold+warm pair each, 64 tokens)
# The engine is sized for 16 streams, with vs_llama_server.py's KV cells (--ctx-size 32768, 2048 a
# stream); --gpu-layers is left at its default, auto, which is what is checked.
phase_start bench "edgeinfer bench at 1/4/16 streams"
start_sampler "$work/gpu-apps-bench.csv"
bench=(.venv/bin/edgeinfer bench --workload chat --concurrency "1,4,16" --max-tokens 64 --repeats 1)
bench+=(--ctx-size 32768 --flash-attn on --json "$work/bench.json")
say "${bench[*]}"
timeout 300 "${bench[@]}" 2>&1 | tee "$work/bench.log" || die "edgeinfer bench failed or ran past 5 min; its output: $work/bench.log"
stop_sampler
phase_end

# --- llama-server: 0 s when built; its first build compiles the CUDA kernels again, several minutes -----
server_dir=${LLAMA_SERVER_DIR:-$cache/llama-server-cuda-$(printf %s "$cuda_args" | md5sum | cut -c1-10)}
server=$server_dir/bin/llama-server
phase_start llama-server "$server"
if [ -x "$server" ]; then
  say "taking the llama-server built before"
else
  if [ ! -d "$server_dir/src/llama_cpp_python-$version" ]; then
    # Another llama-server build's unpacked source is the same llama.cpp (CMake builds out of the tree):
    # no fetch, which offline is the only way.
    server_src=${server_src:-$(compgen -G "$cache/llama-server*/src/llama_cpp_python-$version" | head -1 || true)}
    if [ -n "$server_src" ]; then
      mkdir -p "$server_dir/src"
      ln -s "$server_src" "$server_dir/src/llama_cpp_python-$version"
      say "using the llama.cpp source in $server_src"
    fi
  fi
  say "LLAMA_CMAKE_ARGS=\"$cuda_args\" scripts/build_llama_server.sh $server_dir"
  LLAMA_CMAKE_ARGS=$cuda_args PYTHON=$py scripts/build_llama_server.sh "$server_dir" 2>&1 | tee "$work/llama-server-build.log" ||
    die "building llama-server failed; its output: $work/llama-server-build.log"
fi
"$server" --list-devices >"$work/llama-server-devices.txt" 2>&1 || true
grep -q CUDA "$work/llama-server-devices.txt" ||
  die "$server lists no CUDA device ($work/llama-server-devices.txt): a build without CUDA? rm -rf $server_dir and run again"
phase_end

# --- vs: about 3 min (3 workloads x 3 levels x 3 servers, one cold+warm pair each, 64 tokens, start-ups) --
# vs_llama_server.py has no option for extra llama-server flags, so the offload goes through llama.cpp's
# environment variable for -ngl, which llama-server reads and `edgeinfer serve` does not. llama-server's
# own default (-ngl auto with --fit on) would already put this small model whole on the GPU; "all" makes
# that certain.
# `edgeinfer serve` offloads by its own default, --gpu-layers auto.
phase_start vs "scripts/vs_llama_server.py against the CUDA llama-server"
start_sampler "$work/gpu-apps-vs.csv"
vs=("$py" scripts/vs_llama_server.py --llama-server "$server" --parallel 16 --concurrency "1,4,16")
vs+=(--workloads "chat,agent,multi-agent" --max-tokens 64 --repeats 1 --flash-attn on --json "$work/vs.json")
say "LLAMA_ARG_N_GPU_LAYERS=all ${vs[*]}"
LLAMA_ARG_N_GPU_LAYERS=all timeout 480 "${vs[@]}" 2>&1 | tee "$work/vs.log" ||
  die "vs_llama_server.py failed or ran past 8 min; its output: $work/vs.log"
stop_sampler
phase_end

# --- merge: a second -----------------------------------------------------------------------------------
nvidia-smi --query-gpu=name,memory.total,memory.free,driver_version,compute_cap --format=csv,noheader,nounits \
  >"$work/gpus.csv"
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
dirty=$(git --no-optional-locks status --porcelain 2>/dev/null | wc -l || echo 0) # reads only: no index refresh
GC_WORK=$work GC_COMMIT=$commit GC_DIRTY=$dirty GC_DEVICES=$devices GC_CMAKE_FLAGS=$cmake_flags GC_WHEELS=$wheels \
  GC_SERVER=$server GC_CUDA_ARGS=$cuda_args GC_TOTAL=$((SECONDS - t0)) "$py" - "$out" <<'PY'
import json, os, sys, time
from pathlib import Path

env = os.environ
work = Path(env["GC_WORK"])


def load(name):
    return json.loads((work / name).read_text())


def warm_tps(report):
    """Each target's warm aggregate tok/s by concurrency: the figure to read first."""
    out = {}
    for level in report["levels"]:
        for name, side in level["targets"].items():
            out.setdefault(name, {})[str(level["concurrency"])] = side["warm"]["aggregate_tps"]
    return out


def gpu_apps(*names):
    """The most memory (MiB) each process name held on the GPU while the benches ran."""
    seen = {}
    for name in names:
        path = work / name
        for line in path.read_text().splitlines() if path.exists() else []:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 3 and parts[2].isdigit():
                seen[parts[1]] = max(seen.get(parts[1], 0), int(parts[2]))
    return seen


def mib(v):
    return int(v) if v.isdigit() else v  # "[N/A]" on some setups (MIG)


gpus = []
for line in (work / "gpus.csv").read_text().splitlines():
    name, total, free, driver, cap = (p.strip() for p in line.split(","))
    gpus.append({"name": name, "memory_total_mib": mib(total), "memory_free_mib": mib(free), "driver": driver,
                 "compute_cap": cap})
phases = {k: int(v) for k, v in (line.split("\t") for line in (work / "phases.tsv").read_text().splitlines())}
bench, vs = load("bench.json"), load("vs.json")
engine_layers = {t["name"]: t["config"]["gpu_layers"] for t in bench["targets"] if t.get("config")}
apps = gpu_apps("gpu-apps-bench.csv", "gpu-apps-vs.csv")
result = {
    "kind": "gpu-check",
    "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    "commit": env["GC_COMMIT"],
    "files_differing_from_commit": int(env["GC_DIRTY"]),
    "gpus": gpus,
    "ggml_devices": env["GC_DEVICES"],
    "wheel": {"cmake_flags": env["GC_CMAKE_FLAGS"], "cache": env["GC_WHEELS"], "cuda_architectures": env.get("CUDA_ARCHITECTURES", "")},
    "llama_server": {
        "binary": env["GC_SERVER"],
        "cmake_args": env["GC_CUDA_ARGS"],
        "env": {"LLAMA_ARG_N_GPU_LAYERS": "all"},
        "devices": (work / "llama-server-devices.txt").read_text().strip(),
    },
    "phases_s": phases,
    "total_s": int(env["GC_TOTAL"]),
    "engine_gpu_layers": engine_layers,  # by bench target; 0 would mean the CPU ran the model
    "gpu_processes_mib": apps,
    "summary": {
        "bench_warm_aggregate_tps": warm_tps(bench),
        "vs_warm_aggregate_tps": {r["workload"]: warm_tps(r) for r in vs["reports"]},
    },
    "bench": bench,
    "vs_llama_server": vs,
}
Path(sys.argv[1]).write_text(json.dumps(result, indent=2) + "\n")
print(f"wrote {sys.argv[1]}", file=sys.stderr)
if not any(engine_layers.values()):
    sys.exit(f"gpu_check: the engine bench offloaded no layer ({engine_layers}): its figures are the CPU's")
if apps and not any("llama-server" in n for n in apps):
    print(f"gpu_check: warning: no llama-server process seen on the GPU (seen: {', '.join(apps)})", file=sys.stderr)
PY
total=$((SECONDS - t0))
say "done in $total s$([ "$total" -gt 600 ] && echo ", over the 10-minute budget (a first run's builds? run again)"); logs in $work"
