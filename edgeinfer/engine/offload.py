"""--gpu-layers auto (the default): as many of the model's layers as the GPU's free memory holds, decided
before the load.

llama.cpp's own fitting (llama-server's `--fit`) is not in the library API the bindings give, so the
estimate is built from what they do give: each GPU's free memory (ggml's device registry), each
layer's tensor bytes (the GGUF's header) and its KV bytes per cell (sizing.layer_cell_bytes).
llama.cpp offloads from the end: with n_gpu_layers = k, the output layer and the last k - 1
repeating layers go to the GPU, each with its layers' KV cache (offload_kqv, llama.cpp's default);
the token embeddings stay on the CPU. The device also holds a compute buffer for one micro-batch
(estimated below), and MARGIN_BYTES stay free for the driver, the desktop and other programs, as
llama-server's `--fit-target` leaves 1 GiB. Several GPUs count as one pool (llama.cpp's layer split
spreads layers by free memory), with a margin each. After the load the engine measures what the
device's free memory fell by, shown beside the estimate (Offload.measured_bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from edgeinfer.engine.sizing import layer_cell_bytes
from edgeinfer.llamacpp import ggml
from edgeinfer.llamacpp.core import init_backend
from edgeinfer.models.gguf import GGUFInfo, read_gguf

MIB = 1 << 20
MARGIN_BYTES = 1024 * MIB  # left free on each GPU


@dataclass(frozen=True, slots=True)
class Gpu:
    """One local GPU as ggml reports it."""

    name: str  # ggml's device name, e.g. "Vulkan0", "CUDA0"
    description: str  # the card, e.g. "NVIDIA GeForce RTX 4070"
    free: int  # bytes
    total: int  # bytes


@dataclass(frozen=True, slots=True)
class Offload:
    """Where a model's layers go, and why: one line at start-up, figures in the stats."""

    layers: int  # n_gpu_layers given to llama.cpp (0: the CPU only)
    n_layers: int  # every offloadable layer: the repeating ones and the output layer
    gpus: tuple[Gpu, ...]
    weight_bytes: int  # the model's bytes on the GPU
    kv_bytes: int  # the KV cache's bytes on the GPU
    compute_bytes: int  # the compute buffer reserved on the GPU (an estimate)
    budget_bytes: int  # what the GPUs may take: free memory less the margins (or --gpu-memory)
    draft_layers: int = 0  # the draft model's n_gpu_layers (-1: all, 0: the CPU)
    draft_bytes: int = 0  # the draft model's bytes on the GPU, its KV included
    auto: bool = True  # decided here (False: --gpu-layers N given by hand)
    reason: str = ""  # why the CPU, or why not every layer
    measured_bytes: int | None = None  # what the GPUs' free memory fell by over the load

    @property
    def need_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.compute_bytes + self.draft_bytes

    @property
    def device(self) -> str:
        return ", ".join(f"{g.name} ({g.description})" for g in self.gpus) if self.gpus else "CPU"

    def line(self) -> str:
        """The plan in one line, for start-up."""
        if not self.layers:
            return f"GPU offload: none, the CPU runs every layer ({self.reason})"
        on = "every layer" if self.layers >= self.n_layers else f"{self.layers} of {self.n_layers} layers"
        text = (
            f"GPU offload: {on} on {self.device}; KV cache {self.kv_bytes / MIB:,.0f} MiB on the GPU; "
            f"about {self.need_bytes / MIB:,.0f} MiB of {self.budget_bytes / MIB:,.0f} MiB usable"
        )
        if self.draft_layers:
            text += f"; the draft model on the GPU ({self.draft_bytes / MIB:,.0f} MiB)"
        if self.measured_bytes:
            text += f"; the load took {self.measured_bytes / MIB:,.0f} MiB"
        elif self.measured_bytes == 0:  # lavapipe, and drivers without a memory budget, report a fixed figure
            text += "; the device's free memory figure did not move over the load"
        return text + (f" ({self.reason})" if self.reason else "")


def layer_bytes(info: GGUFInfo) -> list[int]:
    """Weight bytes of each offloadable layer: the repeating layers, then the output layer."""
    out = sum(b for k, b in info.tensor_bytes.items() if k.startswith("output"))
    if "output.weight" not in info.tensor_bytes:  # tied embeddings: llama.cpp copies token_embd to the GPU
        out += info.tensor_bytes.get("token_embd.weight", 0)
    return [info.tensor_bytes.get(f"blk.{i}", 0) for i in range(info.n_layer)] + [out]


def compute_bytes(metadata: dict[str, Any], n_ubatch: int, cells_seen: int) -> int:
    """The device's compute buffer for one micro-batch, estimated from above: float32 logits over the
    vocabulary, the attention scores over the cells one token sees, and a few activations a layer."""
    arch = metadata.get("general.architecture", "")
    vocab = int(metadata.get(f"{arch}.vocab_size", 0) or 0) or len(metadata.get("tokenizer.ggml.tokens", ()) or ())
    width = int(metadata.get(f"{arch}.embedding_length", 0) or 0)
    ffn: Any = metadata.get(f"{arch}.feed_forward_length", 0) or 0
    ffn = max(ffn) if isinstance(ffn, list | tuple) else int(ffn)
    heads: Any = metadata.get(f"{arch}.attention.head_count", 1) or 1
    heads = max(heads) if isinstance(heads, list | tuple) else int(heads)
    floats = n_ubatch * (vocab + heads * cells_seen + 4 * width + 2 * ffn)
    return 4 * floats


def tail_cost(layers: list[int], kv_layers: list[int], k: int) -> tuple[int, int]:
    """The weight and KV bytes of the last k offloadable layers (llama.cpp offloads from the end). layers: each
    layer's weights, the output layer last, which keeps no KV; kv_layers: each repeating layer's KV."""
    n = len(layers)
    kv = list(kv_layers[: n - 1]) + [0] * (n - len(kv_layers[: n - 1]))
    return sum(layers[n - k :]) if k else 0, sum(kv[n - k :]) if k else 0


def fit(
    gpus: list[Gpu],
    layers: list[int],
    kv_layers: list[int],
    compute: int,
    margin: int = MARGIN_BYTES,
    cap: int = 0,
    draft: int = 0,
) -> Offload:
    """How many layers fit. layers: weight bytes of each offloadable layer (output last); kv_layers: KV bytes
    of each repeating layer for every cell; compute: the compute buffer; cap: at most this many bytes on the
    GPUs (0: their free memory less the margin); draft: a draft model's bytes, KV included (0: none)."""
    n = len(layers)
    if not gpus:
        return Offload(0, n, (), 0, 0, 0, 0, reason="no GPU: none is installed, or llama.cpp was built without one")
    budget = sum(max(0, g.free - margin) for g in gpus)
    if cap:
        budget = min(budget, cap)

    def cost(k: int) -> tuple[int, int]:  # the last k layers: (weights, KV)
        return tail_cost(layers, kv_layers, k)

    best = 0
    for k in range(n, 0, -1):
        w, c = cost(k)
        if w + c + compute <= budget:
            best = k
            break
    if not best:
        free = sum(g.free for g in gpus)
        w, c = cost(1)
        return Offload(
            0, n, tuple(gpus), 0, 0, 0, budget,
            reason=f"not even one layer fits: {(w + c + compute) / MIB:,.0f} MiB needed, {budget / MIB:,.0f} MiB "
            f"usable of {free / MIB:,.0f} MiB free",
        )  # fmt: skip
    w, c = cost(best)
    plan = Offload(best, n, tuple(gpus), w, c, compute, budget)
    if best < n:
        return replace(
            plan,
            reason=f"{n - best} layers stay on the CPU: the whole model needs "
            f"{(sum(cost(n)) + compute) / MIB:,.0f} MiB",
        )
    if draft and plan.need_bytes + draft <= budget:
        return replace(plan, draft_layers=-1, draft_bytes=draft)
    if draft:
        return replace(plan, reason="the draft model stays on the CPU: no room for it beside the model")
    return plan


def local_gpus() -> list[Gpu]:
    """This machine's GPUs, with their free memory now."""
    init_backend()
    out = []
    for dev in ggml.local_gpus():
        free, total = ggml.device_memory(dev)
        out.append(Gpu(ggml.device_name(dev), ggml.device_description(dev), free, total))
    return out


def offloads(config: Any) -> bool:
    """Whether an EngineConfig puts layers on a GPU (auto: when there is one)."""
    if config.gpu_layers == 0:
        return False
    init_backend()
    return bool(ggml.local_gpus())


def gpus_free() -> int:
    return sum(g.free for g in local_gpus())


def plan_for(config: Any, info: GGUFInfo, gpus: list[Gpu] | None = None) -> Offload:
    """The offload an EngineConfig asks for (its ctx_size and parallel already decided: sizing.sized)."""
    gpus = local_gpus() if gpus is None else gpus
    per_cell = layer_cell_bytes(info.metadata, config.kv_type)
    seen = config.ctx_size if config.kv_layout == "unified" else max(1, config.ctx_size // max(1, config.parallel))
    compute = compute_bytes(info.metadata, min(config.ubatch_size, config.batch_size), seen)
    draft = 0
    if config.draft_model is not None and config.spec in ("draft", "auto"):
        dinfo = read_gguf(config.draft_model)
        draft = sum(dinfo.tensor_bytes.values()) + config.ctx_size * sum(
            layer_cell_bytes(dinfo.metadata, config.kv_type)
        )
    if config.gpu_layers == "auto":
        plan = fit(
            gpus,
            layer_bytes(info),
            [b * config.ctx_size for b in per_cell],
            compute,
            cap=config.gpu_memory * MIB,
            draft=draft,
        )
    else:  # set by hand: as asked, with the figures for the stats
        n = info.n_layer + 1
        k = (n if config.gpu_layers < 0 else min(config.gpu_layers, n)) if gpus else 0
        w, kv = tail_cost(layer_bytes(info), [b * config.ctx_size for b in per_cell], k)
        no_gpu = "--gpu-layers asks for layers, but there is no GPU: the CPU runs them"
        plan = Offload(
            k, n, tuple(gpus), w, kv, compute if k else 0,
            sum(g.free for g in gpus), draft_layers=k and (-1 if config.gpu_layers < 0 else k), auto=False,
            reason="--gpu-layers set by hand" if gpus or not config.gpu_layers else no_gpu,
        )  # fmt: skip
    if config.draft_gpu_layers != "auto":
        plan = replace(plan, draft_layers=int(config.draft_gpu_layers) if gpus else 0)
    return plan
