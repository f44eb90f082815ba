"""models/gguf.py over ggml's own reader: metadata, long arrays kept as lengths, the truncation check for
every quant type (gguf's block sizes), and one-line errors for files cut or corrupted anywhere. Pure: the
files are written here with gguf's GGUFWriter, no model is loaded."""

from __future__ import annotations

import random

import gguf
import numpy as np
import pytest

from edgeinfer.errors import ModelFileError
from edgeinfer.models.gguf import read_gguf

pytestmark = pytest.mark.pure

# Types the hand-written reader's block table lacked: its truncation check counted them as 0 bytes.
NEWER_TYPES = [
    gguf.GGMLQuantizationType.IQ4_XS,
    gguf.GGMLQuantizationType.IQ2_XXS,
    gguf.GGMLQuantizationType.TQ1_0,
    gguf.GGMLQuantizationType.MXFP4,
]


def write(path, qtype=gguf.GGMLQuantizationType.F32, n_tokens=100):
    """A small GGUF: scalars, a long string array, a long number array, a short one, then one tensor."""
    w = gguf.GGUFWriter(path, "llama")
    w.add_uint32("llama.block_count", 2)
    w.add_uint32("llama.context_length", 4096)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_IQ4_XS)
    w.add_array("tokenizer.ggml.tokens", [f"tok{i}" * (i % 7) for i in range(n_tokens)])
    w.add_array("tokenizer.ggml.scores", [float(i) for i in range(n_tokens)])
    w.add_array("short.list", ["a", "b", "c"])
    w.add_string("tokenizer.chat_template", "{{ messages }}")  # after the long arrays: read at the right offset
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n_el = block * 64
    if qtype == gguf.GGMLQuantizationType.F32:
        w.add_tensor("blk.0.w", np.ones(n_el, dtype=np.float32))
    else:
        w.add_tensor("blk.0.w", np.zeros((1, 64 * size), dtype=np.uint8), raw_dtype=qtype)
    w.add_tensor("output.weight", np.ones(32, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, n_el, n_el * size // block


def test_metadata_long_arrays_and_tensor_bytes(tmp_path):
    path, n_el, nbytes = write(tmp_path / "m.gguf")
    info = read_gguf(path)
    assert info.version == 3 and info.architecture == "llama" and info.n_layer == 2
    assert info.context_length == 4096 and info.quantization == "IQ4_XS"
    assert info.array_lengths == {"tokenizer.ggml.tokens": 100, "tokenizer.ggml.scores": 100}
    assert info.vocab_size == 100 and info.metadata["tokenizer.ggml.tokens"] is None
    assert info.metadata["short.list"] == ["a", "b", "c"]
    assert info.chat_template == "{{ messages }}"
    assert info.n_tensors == 2 and info.n_params == n_el + 32
    assert info.tensor_bytes == {"blk.0": nbytes, "output.weight": 128}


@pytest.mark.parametrize("qtype", NEWER_TYPES, ids=lambda t: t.name)
def test_truncation_counts_the_newer_quant_types(tmp_path, qtype):
    path, _, nbytes = write(tmp_path / "m.gguf", qtype)
    info = read_gguf(path)
    assert info.tensor_bytes["blk.0"] == nbytes
    # Cut into blk.0 itself (output.weight, 128 bytes and padding, follows it).
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 128 - 64 - nbytes // 2])
    with pytest.raises(ModelFileError, match=r"truncated .*fewer than its tensors need.*download it again"):
        read_gguf(cut)


def test_a_cut_anywhere_is_a_one_line_truncation_error(tmp_path):
    path, _, _ = write(tmp_path / "m.gguf")
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    for n in sorted({5, 8, 23, 24, 40, 100, len(data) // 3, len(data) // 2, len(data) - 1}):
        cut.write_bytes(data[:n])
        with pytest.raises(ModelFileError) as e:
            read_gguf(cut)
        assert "truncated" in str(e.value) and "\n" not in str(e.value), n


def test_corrupt_bytes_give_only_model_file_errors(tmp_path):
    """Any byte of the header overwritten: the file reads or is a one-line ModelFileError, never another
    exception (the reader itself raises ValueError, KeyError, IndexError... on such files)."""
    path, _, _ = write(tmp_path / "m.gguf")
    data = path.read_bytes()
    bad = tmp_path / "bad.gguf"
    rng = random.Random(29)
    errors = 0
    for _ in range(300):
        b = bytearray(data)
        at = rng.randrange(4, 1200)
        b[at] = rng.choice([0x00, 0xFF, 0x7F, 0x80, rng.randrange(256)])
        bad.write_bytes(bytes(b))
        try:
            read_gguf(bad)
        except ModelFileError as e:
            errors += 1
            assert "\n" not in str(e) and str(bad) in str(e)
    assert errors > 0


def test_version_and_magic_errors(tmp_path):
    path, _, _ = write(tmp_path / "m.gguf")
    data = bytearray(path.read_bytes())
    data[4:8] = (7).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match="GGUF version 7 is not supported"):
        read_gguf(path)
    path.write_bytes(b"GGML" + bytes(data[4:]))
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        read_gguf(path)
