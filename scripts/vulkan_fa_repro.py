"""A crash of llama.cpp's Vulkan backend with flash attention, seen on Mesa's software device (docs/gpu.md).

    GGML_VK_VISIBLE_DEVICES=0 .venv/bin/python scripts/vulkan_fa_repro.py [on|off] [ONE_ROW_DECODES]

Four llama_decode calls through edgeinfer's thin wrappers of the bindings, every layer on the device:
a 37-token prompt, one token, then three tokens with logits for each (what draft verification sends).
With flash attention on, reading the three rows' logits crashes the process (SIGSEGV); with it off,
or with no one-row decode before the three rows (ONE_ROW_DECODES=0), the rows read. Prints the rows'
greedy tokens when it does not crash.
"""

from __future__ import annotations

import sys

from edgeinfer.llamacpp.core import Batch, Context, ContextParams, Model
from edgeinfer.models.catalog import default_model_path


def main() -> None:
    flash_attn = sys.argv[1] if len(sys.argv) > 1 else "on"
    one_row_decodes = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    model = Model(default_model_path(), gpu_layers=-1)
    params = ContextParams(
        n_ctx=2048, n_batch=512, n_ubatch=512, n_seq_max=1, n_threads=2, n_threads_batch=2,
        flash_attn=flash_attn, kv_type="f16", kv_unified=False,
    )  # fmt: skip
    ctx = Context(model, params)
    tokens = [*range(1000, 1037), 1100, 1101, 1102, 1103, 1104]
    batch = Batch(512)

    def decode(part: list[int], pos: int, every_row: bool) -> None:
        batch.clear()
        batch.add(0, part, pos, True, logits_from=0 if every_row else -1)
        assert ctx.decode(batch)

    decode(tokens[:37], 0, False)
    print("prompt:", ctx.argmax(36), flush=True)
    for j in range(one_row_decodes):
        decode([tokens[37 + j]], 37 + j, False)
        print("one row:", ctx.argmax(0), flush=True)
    start = 37 + one_row_decodes
    decode(tokens[start : start + 3], start, True)
    print("three rows:", [ctx.argmax(i) for i in range(3)], flush=True)


if __name__ == "__main__":
    main()
