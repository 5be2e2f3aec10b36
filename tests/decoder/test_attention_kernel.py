"""llmir's grouped-query attention (`ort.group_query_attention {kernel = "llmir"}`: ai.llmir
GroupQueryAttention in llmir_core/targets/onnxruntime/native/attention.c): one node against onnxruntime's
com.microsoft GroupQueryAttention on the same inputs over a shared KV buffer (a prompt, decode
steps, a chunk after a cached prefix; odd head counts, GQA ratios 1/3/7, batch 2, head_dim 32 and
64, packed and unpacked, rotary halves and pairs, softcap, separate present buffers); decoders
built with either kernel compute the same logits and greedy tokens; the importer reads the op
back; the choice shows in the lowered module and an op the kernel does not take is refused.
Tests that run the kernel are skipped where the library cannot be built."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.errors import InputError
from llmir_core.ir.printer import print_module
from llmir_core.passes.base import clone_module
from llmir_core.passes.manager import run_pipeline
from llmir_core.targets import build, get_target
from llmir_core.targets.onnxruntime.native import DOMAIN, register, unavailable_reason
from llmir_core.targets.onnxruntime.runner import open_decoder
from tests.conftest import requires

from .helpers import greedy, rel, same_decoding

WHY = unavailable_reason()
needs_kernel = requires(None if WHY is None else f"llmir's custom op cannot run: {WHY}")
MS = "com.microsoft"
REPO = Path(__file__).resolve().parents[2]
F32 = np.float32


def _session(
    domain: str,
    heads: int,
    kv: int,
    d: int,
    packed: bool,
    rotary: bool,
    kv8: str = "",
    bias: bool = False,
    **at: Any,
) -> Any:
    import onnxruntime as ort
    from onnx import TensorProto, helper

    vi, f = helper.make_tensor_value_info, TensorProto.FLOAT
    if packed:
        ins, inputs = ["qkv", "", ""], [vi("qkv", f, ["B", "S", (heads + 2 * kv) * d])]
    else:
        ins = ["q", "k", "v"]
        inputs = [vi(n, f, ["B", "S", w * d]) for n, w in (("q", heads), ("k", kv), ("v", kv))]
    ins += ["pk", "pv", "seqlens", "total"]
    cache = TensorProto.INT8 if kv8 else f
    inputs += [vi("pk", cache, ["B", kv, "L", d]), vi("pv", cache, ["B", kv, "L", d])]
    inputs += [vi("seqlens", TensorProto.INT32, ["B"]), vi("total", TensorProto.INT32, [])]
    if rotary:
        ins += ["cos", "sin", "pos"]
        inputs += [vi("cos", f, [None, None]), vi("sin", f, [None, None])]
        inputs += [vi("pos", TensorProto.INT64, ["B", "S"])]
        at["do_rotary"] = 1
    if kv8:  # int8 caches: k_scale and v_scale are inputs 12 and 13
        ins += [""] * (12 - len(ins)) + ["ks", "vs"]
        inputs += [vi("ks", f, None), vi("vs", f, None)]
        at.update(k_quant_type=kv8.upper(), v_quant_type=kv8.upper(), kv_cache_bit_width=8)
    if bias and domain == DOMAIN:  # llmir's input 14: the packed projection's bias
        ins += [""] * (14 - len(ins)) + ["bias"]
        inputs += [vi("bias", f, [None])]
    node = helper.make_node(
        "GroupQueryAttention", ins, ["out", "pk_out", "pv_out"], domain=domain,
        num_heads=heads, kv_num_heads=kv, **at,
    )  # fmt: skip
    outs = [vi("out", f, None)] + [vi(n, cache, None) for n in ("pk_out", "pv_out")]
    model = helper.make_model(
        helper.make_graph([node], "gqa", inputs, outs),
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(domain, 1)],
    )
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    if domain == DOMAIN:
        register(so, ["llmir_ops"])
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _compare(
    heads: int,
    kv: int,
    d: int,
    batch: int,
    packed: bool,
    rotary: bool,
    steps: tuple[int, ...] = (7, 1, 1, 1),
    shared: bool = True,
    kv8: str = "",
    bias: bool = False,
    rotary_dim: int = 0,
    **at: Any,
) -> float:
    """Worst |llmir - onnxruntime| over the outputs and KV buffers of a run of steps (tokens per
    step) on the same inputs, each kernel writing its own buffers. With `bias`, llmir's node
    takes a qkv bias (input 14) and onnxruntime's the packed rows with the bias added;
    `rotary_dim` (0: head_dim) rotates the first rotary_dim channels of each head."""
    import onnxruntime as ort

    rng = np.random.default_rng(heads * 100 + kv * 10 + d + batch)
    cap = sum(steps) + 3
    sess = {
        dom: _session(dom, heads, kv, d, packed, rotary, kv8, bias, **at) for dom in (MS, DOMAIN)
    }
    qkv_bias = rng.standard_normal((heads + 2 * kv) * d).astype(F32)
    cache = np.int8 if kv8 else F32
    bufs = {dom: [np.zeros((batch, kv, cap, d), cache) for _ in range(2)] for dom in sess}
    scales = {}
    if kv8:
        shape = (1, kv, 1, d) if kv8 == "per_channel" else (1,)
        scales = {n: rng.uniform(0.01, 0.04, shape).astype(F32) for n in ("ks", "vs")}
    ang = rng.standard_normal((cap, (rotary_dim or d) // 2)).astype(F32)
    n, worst = 0, 0.0
    for s in steps:
        widths = {"qkv": heads + 2 * kv} if packed else {"q": heads, "k": kv, "v": kv}
        feeds = {k: rng.standard_normal((batch, s, w * d)).astype(F32) for k, w in widths.items()}
        feeds["seqlens"] = np.full((batch,), n + s - 1, np.int32)
        feeds["total"] = np.array(n + s, np.int32)
        feeds.update(scales)
        if rotary:
            feeds["cos"], feeds["sin"] = np.cos(ang), np.sin(ang)
            feeds["pos"] = np.broadcast_to(np.arange(n, n + s), (batch, s)).astype(np.int64)
        got = {}
        for dom, sn in sess.items():
            io = sn.io_binding()
            io.bind_output("out")  # outputs come back in the order they are bound
            mine = dict(feeds)
            if bias and dom == DOMAIN:
                mine["bias"] = qkv_bias
            elif bias:
                mine["qkv"] = feeds["qkv"] + qkv_bias
            for k, v in mine.items():
                io.bind_cpu_input(k, np.ascontiguousarray(v))
            for name, buf in zip(("pk", "pv"), bufs[dom]):
                if shared:  # llmir's runtime: past and present are one buffer
                    val = ort.OrtValue.ortvalue_from_numpy(buf)
                    io.bind_ortvalue_input(name, val)
                    io.bind_ortvalue_output(name + "_out", val)
                else:
                    io.bind_cpu_input(name, buf[:, :, :n].copy())
                    io.bind_output(name + "_out")
            sn.run_with_iobinding(io)
            outs = io.copy_outputs_to_cpu()
            if not shared:
                assert outs[1].shape == (batch, kv, n + s, d)
                for buf, o in zip(bufs[dom], outs[1:]):
                    buf[:, :, : n + s] = o
            got[dom] = outs[0]
        assert got[DOMAIN].shape == (batch, s, heads * d)
        worst = max(worst, float(np.abs(got[DOMAIN] - got[MS]).max()))
        for a, b in zip(bufs[DOMAIN], bufs[MS]):
            worst = max(worst, float(np.abs(a.astype(F32) - b.astype(F32)).max()))
        n += s
    return worst


@needs_kernel
@pytest.mark.parametrize(
    "heads,kv,d,batch,packed,rotary,extra",
    [  # non-default attributes first (a broken kernel fails early under -x)
        (6, 2, 64, 1, True, True, {"softcap": 20.0, "scale": 0.3}),  # gemma2-style
        (9, 3, 64, 1, True, True, {"local_window_size": 70, "softcap": 30.0}),
        (4, 2, 32, 1, True, True, {"local_window_size": 5}),  # sliding window
        (7, 1, 32, 2, True, True, {"local_window_size": 100}),
        (3, 1, 64, 1, True, True, {"rotary_interleaved": 1}),  # rotary pairs
        (9, 3, 64, 1, True, True, {}),  # SmolLM2-135M: ratio 3
        (14, 2, 64, 1, True, True, {}),  # Qwen2.5-0.5B: ratio 7
        (7, 1, 32, 2, True, True, {}),  # ratio 7, batch 2, head_dim 32
        (5, 5, 32, 2, False, True, {}),  # ratio 1, unpacked q/k/v
        (9, 3, 32, 1, True, False, {}),  # no rotary
        (4, 2, 24, 1, True, False, {}),  # head_dim a multiple of 8, not of 16
        (4, 1, 128, 1, True, True, {}),  # head_dim 128
    ],
)
def test_matches_onnxruntime(
    heads: int, kv: int, d: int, batch: int, packed: bool, rotary: bool, extra: dict[str, Any]
) -> None:
    # a 7-token prompt, decode steps, chunks after the prefix, decode steps past 64-key blocks
    # and (274 keys) split into key chunks
    steps = (7, *([1] * 4), 60, 1, 1, 199, 1, 1)
    if batch > 1:  # onnxruntime takes a multi-token chunk after a prefix for batch 1 only
        steps = (300, 1, 1, 1)  # 301+ keys: decode split into key chunks
    assert _compare(heads, kv, d, batch, packed, rotary, steps, **extra) <= 1e-5


@needs_kernel
@pytest.mark.parametrize(
    "rd,extra",
    [
        (16, {}),  # the channels past rotary_dim are copied, not rotated
        (48, {"rotary_interleaved": 1}),
        (32, {"softcap": 5.0, "local_window_size": 9, "scale": 0.2}),  # every attribute at once
    ],
)
def test_partial_rotary_matches_onnxruntime(rd: int, extra: dict[str, Any]) -> None:
    steps = (7, 1, 1, 60, 1, 70, 1)
    assert _compare(6, 2, 64, 1, True, True, steps, rotary_dim=rd, **extra) <= 1e-5


def _rotate64(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    """x [..., D] rotated on its first 2 * cos.shape[-1] channels (float64)."""
    half = cos.shape[-1]
    y = x.astype(np.float64).copy()
    if interleaved:
        x1, x2 = x[..., 0 : 2 * half : 2], x[..., 1 : 2 * half : 2]
        y[..., 0 : 2 * half : 2], y[..., 1 : 2 * half : 2] = (
            x1 * cos - x2 * sin,
            x2 * cos + x1 * sin,
        )
    else:
        x1, x2 = x[..., :half], x[..., half : 2 * half]
        y[..., :half], y[..., half : 2 * half] = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    return y


@needs_kernel
@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_scalar_tail_matches_numpy(interleaved: int) -> None:
    """rotary_dim 24 (12 pairs: 8 in a vector, 4 in the scalar tail), which onnxruntime's op
    refuses (cos_cache width a multiple of 8): against a float64 numpy attention, element by
    element, over a prompt and decode steps."""
    heads, kv, d, rd, cap = 4, 2, 32, 24, 16
    rng = np.random.default_rng(24 + interleaved)
    sess = _session(DOMAIN, heads, kv, d, True, True, rotary_interleaved=interleaved)
    ang = rng.standard_normal((cap, rd // 2))
    cos, sin = np.cos(ang).astype(F32), np.sin(ang).astype(F32)
    pk, pv = np.zeros((1, kv, cap, d), F32), np.zeros((1, kv, cap, d), F32)
    keys, vals, n = np.zeros((kv, 0, d)), np.zeros((kv, 0, d)), 0
    for s in (7, 1, 1):
        qkv = rng.standard_normal((1, s, (heads + 2 * kv) * d)).astype(F32)
        pos = np.arange(n, n + s)
        feeds = {
            "qkv": qkv, "pk": pk, "pv": pv, "seqlens": np.array([n + s - 1], np.int32),
            "total": np.array(n + s, np.int32), "cos": cos, "sin": sin, "pos": pos[None],
        }  # fmt: skip
        out, pk, pv = sess.run(None, feeds)
        rows = qkv[0].reshape(s, heads + 2 * kv, d)
        c, sn = cos[pos][:, None], sin[pos][:, None]
        q = _rotate64(rows[:, :heads], c, sn, bool(interleaved)) / np.sqrt(d)
        keys = np.concatenate(
            [
                keys,
                _rotate64(rows[:, heads : heads + kv], c, sn, bool(interleaved)).transpose(1, 0, 2),
            ],
            1,
        )  # noqa: E501
        vals = np.concatenate(
            [vals, rows[:, heads + kv :].astype(np.float64).transpose(1, 0, 2)], 1
        )  # noqa: E501
        want = np.zeros((s, heads, d))
        for h in range(heads):
            sc = q[:, h] @ keys[h // (heads // kv)].T  # [s, n + s]
            sc[np.arange(n + s)[None, :] > (n + np.arange(s))[:, None]] = -np.inf
            p = np.exp(sc - sc.max(-1, keepdims=True))
            want[:, h] = (p / p.sum(-1, keepdims=True)) @ vals[h // (heads // kv)]
        assert np.abs(out[0] - want.reshape(s, heads * d)).max() <= 1e-5
        assert np.abs(pk[0, :, : n + s] - keys).max() <= 1e-5
        n += s


@needs_kernel
@pytest.mark.parametrize("kv8", ["per_tensor", "per_channel"])
@pytest.mark.parametrize("shared", [True, False])
def test_int8_caches_match_onnxruntime(kv8: str, shared: bool) -> None:
    """int8 caches (kv-cache-int8): the same codes (x * (1/s) rounded half to even) and the
    attention over f32(codes) * s."""
    steps = (7, 1, 1, 60, 1, 199, 1)
    assert _compare(9, 3, 64, 1, True, True, steps, shared, kv8) <= 1e-5
    assert _compare(7, 1, 32, 2, True, True, (300, 1, 1), shared, kv8) <= 1e-5


@needs_kernel
def test_qkv_bias_matches_onnxruntime_on_biased_rows() -> None:
    """llmir's input 14 (the packed projection's bias) adds the bias to every packed row: the
    same as onnxruntime's op fed the rows with the bias added (prompt, decode, chunks, batch 2,
    int8 caches)."""
    steps = (7, 1, 1, 60, 1, 199, 1)
    assert _compare(14, 2, 64, 1, True, True, steps, bias=True) <= 1e-5
    assert _compare(7, 1, 32, 2, True, True, (300, 1, 1), bias=True) <= 1e-5
    assert _compare(9, 3, 64, 1, True, True, (5, 1), kv8="per_channel", bias=True) <= 1e-5


@needs_kernel
def test_qkv_bias_needs_the_packed_form() -> None:
    sess = _session(DOMAIN, 2, 1, 32, True, False, bias=True)
    feeds = {
        "qkv": np.zeros((1, 1, 128), F32),
        "pk": np.zeros((1, 1, 4, 32), F32),
        "pv": np.zeros((1, 1, 4, 32), F32),
        "seqlens": np.array([0], np.int32),
        "total": np.array(1, np.int32),
        "bias": np.zeros(96, F32),  # not (2 + 2 x 1) x 32
    }
    with pytest.raises(Exception, match="qkv_bias must be"):
        sess.run(None, feeds)


@needs_kernel
def test_separate_present_buffers_match_onnxruntime() -> None:
    """Past and present as separate tensors: the past rows are copied, the new ones appended."""
    assert _compare(9, 3, 64, 1, True, True, (5, 1, 3, 1), shared=False) <= 1e-5


@needs_kernel
def test_refuses_a_buffer_too_short() -> None:
    sess = _session(DOMAIN, 2, 1, 32, True, False)
    feeds = {
        "qkv": np.zeros((1, 1, 128), F32),
        "pk": np.zeros((1, 1, 4, 32), F32),
        "pv": np.zeros((1, 1, 4, 32), F32),
        "seqlens": np.array([9], np.int32),  # the new row would land at position 9 of 4
        "total": np.array(4, np.int32),
    }
    with pytest.raises(Exception, match="seqlens_k does not fit"):
        sess.run(None, feeds)


def _lowered(module: Any, **options: Any) -> str:
    lowering = get_target("onnxruntime").lowering(options)
    return print_module(run_pipeline(clone_module(module), lowering).module)


def _module(tmp_path: Path, heads: int, kv: int, hidden: int) -> Any:
    from llmir_core.frontends.hf import import_hf

    from .tiny import LlamaShape, make_llama_folder

    shape = LlamaShape(hidden=hidden, heads=heads, kv_heads=kv)
    folder = make_llama_folder(tmp_path / f"h{heads}", shape, tokenizer=False)
    return import_hf(folder, require_tokenizer=False)


@needs_kernel
@pytest.mark.parametrize("heads,kv,hidden", [(3, 1, 96), (7, 1, 224), (4, 2, 64)])
def test_decoder_matches_onnxruntime_attention(
    heads: int, kv: int, hidden: int, tmp_path: Path
) -> None:
    module = _module(tmp_path, heads, kv, hidden)
    text = _lowered(module)  # auto: llmir's kernel where the library builds
    gqa = [x for x in text.splitlines() if "ort.group_query_attention" in x]
    assert len(gqa) == 2 and all('kernel = "llmir"' in x for x in gqa)
    build(module, str(tmp_path / "llmir"), "onnxruntime")
    build(module, str(tmp_path / "ort"), "onnxruntime", options={"attention_kernel": "onnxruntime"})
    import onnx

    model = onnx.load(str(tmp_path / "llmir" / "model.onnx"), load_external_data=False)
    ours = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(ours) == 2 and {n.domain for n in ours} == {DOMAIN}
    assert json.loads((tmp_path / "llmir" / "manifest.json").read_text())["custom_ops"] == [
        "llmir_ops"
    ]
    a, b = open_decoder(str(tmp_path / "llmir")), open_decoder(str(tmp_path / "ort"))
    prompt = np.array([[1, 5, 9, 2, 7, 3, 11, 4]])
    a.reset(1)
    b.reset(1)
    assert rel(a.forward(prompt), b.forward(prompt)) <= 1e-4
    for tok in (3, 17, 42, 8):
        assert rel(a.forward(np.array([[tok]])), b.forward(np.array([[tok]]))) <= 1e-4
    assert greedy(a, [1, 5, 9], 24) == greedy(b, [1, 5, 9], 24)
    a.reset(2)  # batch 2, equal lengths
    b.reset(2)
    two = np.array([[1, 5, 9, 2], [7, 3, 11, 4]])
    assert rel(a.forward(two), b.forward(two)) <= 1e-4
    assert rel(a.forward(two[:, :1]), b.forward(two[:, :1])) <= 1e-4


@needs_kernel
def test_reimported_llmir_attention(tiny_module: Any, tmp_path: Path) -> None:
    """`llmir import` of a model.onnx with ai.llmir GroupQueryAttention nodes reads them as it
    reads com.microsoft's: the two imported modules are the same text (but the weights' file)."""
    from llmir_core.frontends.onnx import import_onnx

    texts = []
    for kind in ("llmir", "onnxruntime"):
        art = tmp_path / kind
        build(tiny_module, str(art), "onnxruntime", options={"attention_kernel": kind})
        again, _ = import_onnx(str(art / "model.onnx"))
        assert sum(op.name == "llm.scaled_dot_product_attention" for op in again.main.ops) == 2
        texts.append(print_module(again).replace(str(art), "ART"))
    assert texts[0] == texts[1]


def test_for_portable_x86_64_onnxruntime_attention_is_kept(tiny_module: Any) -> None:
    text = _lowered(tiny_module, cpu="x86-64")
    gqa = [x for x in text.splitlines() if "ort.group_query_attention" in x]
    assert len(gqa) == 2 and not any("kernel =" in x for x in gqa)
    with pytest.raises(InputError, match="attention_kernel=llmir needs llmir's kernels"):
        _lowered(tiny_module, attention_kernel="llmir", cpu="x86-64")
    # the default cpu (x86-64-v3), whatever this machine has: llmir's kernel
    for opts in ({}, {"attention_kernel": "llmir"}):
        text = _lowered(tiny_module, **opts)
        gqa = [x for x in text.splitlines() if "ort.group_query_attention" in x]
        assert len(gqa) == 2 and all('kernel = "llmir"' in x for x in gqa)


def test_an_int8_cache_takes_llmir_attention() -> None:
    """An int8 cache (kv-cache-int8{scales=calibrated}) runs on llmir's kernel too."""
    from llmir_core.ir.parser import parse_module
    from llmir_core.targets.onnxruntime.lower_attention import LowerOrtAttention

    path = REPO / "tests/filecheck/passes/lower-ort-attention.int8_kv.llmir"
    module = parse_module(path.read_text(), str(path))
    lowering = [LowerOrtAttention(attention_kernel="llmir")]
    text = print_module(run_pipeline(module, lowering).module)
    assert 'kv_quant = "per_channel"' in text and 'kernel = "llmir"' in text


def test_an_odd_head_dim_keeps_onnxruntime_attention(tmp_path: Path) -> None:
    """head_dim 12 (not a multiple of 8): auto keeps com.microsoft's op; llmir is an input error
    at the attention."""
    module = _module(tmp_path, 4, 2, 48)
    lines = [x for x in _lowered(module).splitlines() if "ort.group_query_attention" in x]
    assert len(lines) == 2 and not any("kernel =" in x for x in lines)
    with pytest.raises(InputError, match="llmir's attention kernel does not take head_dim 12"):
        _lowered(module, attention_kernel="llmir")


def test_bad_attention_kernel_is_a_usage_error(tiny_module: Any) -> None:
    with pytest.raises(InputError, match="unknown attention_kernel 'flash'"):
        _lowered(tiny_module, attention_kernel="flash")


def test_llmir_kernel_refuses_an_odd_head_dim_in_the_ir() -> None:
    from llmir_core.ir.parser import parse_module
    from llmir_core.verifier import verify

    f = "tensor<1x1x48xf32>"  # 2 + 2 x 1 heads of head_dim 12 (not a multiple of 8)
    kv = "tensor<1x1x8x12xf32>"
    text = (
        f"module @m {{\n  func.func @main(%qkv: {f}, %pk: {kv}, %pv: {kv}, %pos: "
        "tensor<1x1xi64>) -> (tensor<1x1x24xf32>) {\n"
        "    %o, %k, %v = ort.group_query_attention %qkv, %pk, %pv, %pos {num_heads = 2, "
        'kv_num_heads = 1, packed = true, kernel = "llmir"} : '
        f"({f}, {kv}, {kv}, tensor<1x1xi64>) -> (tensor<1x1x24xf32>, tensor<1x1x9x12xf32>, "
        "tensor<1x1x9x12xf32>)\n    return %o : tensor<1x1x24xf32>\n  }\n}\n"
    )
    problems = verify(parse_module(text))
    assert any('kernel "llmir" does not take head_dim 12' in p.message for p in problems)


@needs_kernel
def test_qwen2_biases_fold_into_llmir_attention(tmp_path: Path) -> None:
    """Qwen2's q/k/v biases: on llmir's kernel the bias add is part of the attention node (one
    node less a layer); the decoder computes what the op-by-op build (onnxruntime's attention
    after an Add) does, and `llmir import` of the artifact reads the bias back."""
    import onnx

    from llmir_core.frontends.hf import import_hf
    from llmir_core.frontends.onnx import import_onnx

    from .tiny import ARCH_SHAPES, make_llama_folder

    folder = make_llama_folder(tmp_path / "q", ARCH_SHAPES["qwen2"], tokenizer=False)
    module = import_hf(folder, require_tokenizer=False)
    text = _lowered(module)
    assert text.count("qkv_bias = true") == text.count("ort.group_query_attention") == 2
    build(module, str(tmp_path / "llmir"), "onnxruntime")
    build(module, str(tmp_path / "ort"), "onnxruntime", options={"attention_kernel": "onnxruntime"})
    graphs = {
        k: onnx.load(str(tmp_path / k / "model.onnx"), load_external_data=False)
        for k in ("llmir", "ort")
    }
    ours = [n for n in graphs["llmir"].graph.node if n.op_type == "GroupQueryAttention"]
    assert len(ours) == 2 and all(len(n.input) == 15 and n.input[14] for n in ours)
    assert len(graphs["llmir"].graph.node) == len(graphs["ort"].graph.node) - 2  # the two Adds
    same_decoding(open_decoder(str(tmp_path / "llmir")), open_decoder(str(tmp_path / "ort")))
    again, _ = import_onnx(str(tmp_path / "llmir" / "model.onnx"))
    assert sum(op.name == "llm.scaled_dot_product_attention" for op in again.main.ops) == 2


def test_qkv_bias_is_checked_in_the_ir() -> None:
    from llmir_core.ir.parser import parse_module
    from llmir_core.verifier import verify

    f = "tensor<1x1x64xf32>"  # 2 + 2 x 1 heads of head_dim 16
    kv = "tensor<1x1x8x16xf32>"

    def problems(bias: str, attrs: str) -> list[str]:
        text = (
            f"module @m {{\n  func.func @main(%qkv: {f}, %pk: {kv}, %pv: {kv}, %pos: "
            f"tensor<1x1xi64>, %b: {bias}) -> (tensor<1x1x32xf32>) {{\n"
            "    %o, %k, %v = ort.group_query_attention %qkv, %pk, %pv, %pos, %b {num_heads = 2, "
            f"kv_num_heads = 1, packed = true, qkv_bias = true{attrs}}} : "
            f"({f}, {kv}, {kv}, tensor<1x1xi64>, {bias}) -> (tensor<1x1x32xf32>, "
            "tensor<1x1x9x16xf32>, tensor<1x1x9x16xf32>)\n    return %o : tensor<1x1x32xf32>\n"
            "  }\n}\n"
        )
        return [p.message for p in verify(parse_module(text)) if "llmir.dialects" not in p.message]

    assert problems("tensor<64xf32>", ', kernel = "llmir"') == []
    assert any(
        "qkv_bias must be f32 [64]" in m for m in problems("tensor<32xf32>", ', kernel = "llmir"')
    )
    assert any(
        'qkv_bias takes the packed form on kernel "llmir"' in m
        for m in problems("tensor<64xf32>", "")
    )


def test_attention_kernel_flag(tiny_dir: Path, tmp_path: Path) -> None:
    """`llmir build|optimize --attention-kernel`: the lowering option from the command line."""
    from llmir_core.frontends import import_model
    from tests.conftest import run_cli

    src = tmp_path / "tiny.llmir"
    import_model(tiny_dir, out_path=src)
    out = tmp_path / "art"
    r = run_cli("build", str(src), "-o", str(out), "--attention-kernel", "onnxruntime", "-q")
    assert r.returncode == 0, r.stderr
    lowered = (out / "model.lowered.llmir").read_text()
    gqa = [x for x in lowered.splitlines() if "ort.group_query_attention" in x]
    assert len(gqa) == 2 and not any("kernel =" in x for x in gqa)
    assert "attention_kernel=onnxruntime" in json.dumps(
        json.loads((out / "manifest.json").read_text())
    )
    r = run_cli("optimize", str(src), "--target", "onnxruntime", "--attention-kernel", "llmir")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count('kernel = "llmir"') >= 2
    r = run_cli("build", str(src), "-o", str(tmp_path / "bad"), "--attention-kernel", "flash")
    assert (
        r.returncode == 2
        and "--attention-kernel must be one of auto, llmir, onnxruntime" in r.stderr
    )
    assert not (tmp_path / "bad").exists()
    r = run_cli("optimize", str(src), "--attention-kernel", "llmir")
    assert r.returncode == 2 and "--attention-kernel: lowering options need --target" in r.stderr
