"""The "ledger-cuda" decoder (ledger.image.cuda_decode) on the CPU: its torch path (no kernels,
no CUDA graph) against the "ledger" FastLlama decoder, an adapter merged, the quantized formats
close to the dense one, chunked stop handling; on a GPU (marked gpu) the kernels and the graph."""

from __future__ import annotations

import pytest
import torch

from ledger.image import cuda_decode as cd
from ledger.image import generate as gen


def _base(seed=0, intermediate=256, hidden=128, heads=4, kv_heads=2):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=300, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=2,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=128,
                      tie_word_embeddings=False, initializer_range=0.2)
    torch.manual_seed(seed)
    m = LlamaForCausalLM(cfg)
    return cfg.to_dict(), {k: v.detach().clone() for k, v in m.state_dict().items()}


def _adapter(sd, r=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i in range(2):
        for m, blk in cd._MODULES.items():
            n, k = sd[f"model.layers.{i}.{blk}.{m}.weight"].shape
            key = f"base_model.model.model.layers.{i}.{blk}.{m}"
            out[key + ".lora_A.weight"] = torch.randn(r, k, generator=g) * 0.05
            out[key + ".lora_B.weight"] = torch.randn(n, r, generator=g) * 0.05
    return out, {"lora_alpha": 16, "r": r}


@pytest.mark.parametrize("with_adapter", [False, True])
def test_torch_path_is_the_fastllama_decoder(with_adapter):
    cfg, sd = _base()
    shape = gen.Shape.of(cfg)
    fast = gen.FastLlama(sd, shape)
    lora, acfg = _adapter(sd) if with_adapter else (None, None)
    Wf = fast.merged(lora, acfg)
    cuda = cd.CudaLlama(sd, shape, "bf16", device="cpu", dtype=torch.float32, graphs=False, context=64)
    cuda.load(lora, acfg)
    ids = [5, 17, 42, 7, 99]
    assert cuda.decode(ids, 20) == fast.greedy(Wf, ids, 20, frozenset())
    with torch.inference_mode():
        got = cuda._forward(torch.tensor(ids), torch.arange(len(ids)))
    assert torch.allclose(got, fast.logits(Wf, ids)[-1], atol=1e-4)
    assert set(cuda.realizations.values()) == {"torch"}


@pytest.mark.parametrize("fmt", ["int8", "q4b32"])
def test_quantized_formats_are_the_dense_decoder_on_the_dequantized_weights(fmt):
    """Quantization is per output row (blocks along K), so quantizing the fused matrices equals
    quantizing each projection: the decoder in `fmt` is the dense decoder on the round-tripped
    weights, to float rounding."""
    from ledger.kernels import qlinear

    cfg, sd = _base()
    shape = gen.Shape.of(cfg)
    rt = dict(sd)
    for k, v in sd.items():
        if k.endswith("_proj.weight") or k == "lm_head.weight":
            rt[k] = qlinear.dequantize(*qlinear.quantize(v.float(), fmt), fmt, torch.float32)
    dense = cd.CudaLlama(rt, shape, "bf16", device="cpu", dtype=torch.float32, graphs=False, context=64)
    q = cd.CudaLlama(sd, shape, fmt, device="cpu", dtype=torch.float32, graphs=False, context=64)
    dense.load()
    q.load()
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    with torch.inference_mode():
        a = dense._forward(torch.tensor(ids), torch.arange(8))
        b = q._forward(torch.tensor(ids), torch.arange(8))
    assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)
    assert q.decode(ids, 16) == dense.decode(ids, 16)
    # no kernels on the CPU: every matrix says it runs torch's dequantize + F.linear
    assert set(q.realizations.values()) == {"torch-dequant"} and len(q.realizations) == 2 * 4 + 1


def test_stop_tokens_end_the_answer_whatever_the_chunk():
    cfg, sd = _base()
    shape = gen.Shape.of(cfg)
    d = cd.CudaLlama(sd, shape, "bf16", device="cpu", dtype=torch.float32, graphs=False, context=64)
    d.load()
    ids = [5, 17, 42]
    full = d.decode(ids, 30)
    stop = full[11]
    first = full.index(stop)
    for chunk in (1, 3, 8, 64):
        assert d.decode(ids, 30, frozenset({stop}), chunk=chunk) == full[:first]
        assert d.decode(ids, 7, chunk=chunk) == full[:7]


def test_context_bound_is_refused():
    from ledger.errors import BadInput

    cfg, sd = _base()
    d = cd.CudaLlama(sd, gen.Shape.of(cfg), "bf16", device="cpu", dtype=torch.float32, graphs=False, context=16)
    with pytest.raises(BadInput):
        d.decode(list(range(10)), 7)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["int8", "q4b32"])
def test_kernels_and_graph_give_the_torch_paths_tokens(fmt):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    cfg, sd = _base(intermediate=512)
    shape = gen.Shape.of(cfg)
    fast = cd.CudaLlama(sd, shape, fmt, device="cuda", context=96)
    fast.load()
    assert all(v == f"ledger:{cd.KERNEL_OF[fmt]}" for v in fast.realizations.values())
    ref = cd.CudaLlama(sd, shape, fmt, device="cuda", context=96, kernels=None, graphs=False, fused_step=False)
    ref.kernels = None
    ref.load()
    assert set(ref.realizations.values()) == {"torch-dequant"}
    ids = [5, 17, 42, 7, 99]
    fast.decode(ids, 40)        # captures and replays the graph
    ref.decode(ids, 40)
    # one decode step from the same cache: the kernel's matvec (fp32 accumulation, the scale
    # applied to the sum) against torch's dequantize-to-bf16 + cuBLAS; greedy tokens of a random
    # model fork on such rounding differences, so the logits are compared
    with torch.inference_mode():
        tok, pos = torch.tensor([11], device="cuda"), torch.tensor([5], device="cuda")
        for d in (fast, ref):
            d.k_cache.zero_()
            d.v_cache.zero_()
            d._forward(torch.tensor(ids, device="cuda"), torch.arange(5, device="cuda"))
        a, b = fast._forward(tok, pos).float(), ref._forward(tok, pos).float()
    assert float((a - b).norm() / b.norm()) < 0.02
    assert fast._graph and not ref._graph


def test_the_image_model_serves_through_the_cuda_decoder_by_name(monkeypatch, tmp_path):
    """Model(decoder="ledger-cuda-bf16") builds a CudaLlama (here on the CPU, no graph) with the
    FastLlama interface: merged(adapter) -> weights, greedy(weights, ...), logits(weights, ...)."""
    cfg, sd = _base()
    shape = gen.Shape.of(cfg)
    made = {}

    class OnCpu(cd.CudaLlama):
        def __init__(self, base_sd, shape, fmt, **kw):
            super().__init__(base_sd, shape, fmt, device="cpu", dtype=torch.float32, graphs=False,
                             context=kw.get("context", 64))
            made["fmt"] = fmt

    monkeypatch.setattr(cd, "CudaLlama", OnCpu)
    fast = gen.FastLlama(sd, shape)
    impl = OnCpu(sd, shape, gen.CUDA_DECODERS["ledger-cuda-bf16"], context=64)
    lora, acfg = _adapter(sd)
    W, Wf = impl.merged(lora, acfg), fast.merged(lora, acfg)
    ids = [9, 8, 7, 6]
    assert impl.greedy(W, ids, 12, frozenset()) == fast.greedy(Wf, ids, 12, frozenset())
    assert torch.allclose(impl.logits(W, ids), fast.logits(Wf, ids), atol=1e-4)
    base = impl.merged(None, None)
    assert impl.greedy(base, ids, 12, frozenset()) == fast.greedy(fast.merged(None, None), ids, 12, frozenset())
    assert made["fmt"] == "bf16" and gen.CUDA_DECODERS["ledger-cuda"] == "q4b32"


def test_the_image_policy_grants_the_gpu_only_when_asked(tmp_path):
    from ledger.image import confine
    from ledger.store import Store

    store = Store.init(tmp_path / "s")
    (tmp_path / "buf").mkdir()
    cpu, _ = confine.policy(store, [], tmp_path / "buf")
    gpu, _ = confine.policy(store, [], tmp_path / "buf", gpu=True)
    assert (cpu.gpu, gpu.gpu) == (False, True) and not gpu.network
    # the image's seccomp filter follows the policy: the GPU's (the driver's unix sockets) is another
    assert confine.rules(gpu)[1] != confine.rules(cpu)[1]


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["int8", "q4b32"])
def test_large_matrices_are_served_by_the_x16_kernels(fmt):
    """Selection by shape: the fp16-tensor-core variant for a large matrix that fits it, the
    bf16-path kernel for a small one or an x that does not fit shared memory; the bound x16
    launcher computes the dequantized matvec."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from ledger.kernels import qlinear

    ks = cd.Kernels()
    assert ks.kernel_for(fmt, 1024, 512) == cd.KERNEL_OF[fmt]
    assert ks.kernel_for(fmt, 8192, 4096) == cd.X16_OF[fmt]
    assert ks.kernel_for(fmt, 4096, 32768) == cd.KERNEL_OF[fmt]
    g = torch.Generator(device="cuda").manual_seed(3)
    w = torch.randn(8192, 4096, device="cuda", generator=g) / 64
    q, s = qlinear.quantize(w, fmt)
    m = cd.Matrix(fmt, 8192, 4096, q.contiguous(), s.contiguous())
    launch = ks.bind(m)
    x = torch.randn(1, 4096, device="cuda", generator=g).to(torch.bfloat16)
    y = torch.empty(1, 8192, device="cuda", dtype=torch.bfloat16)
    launch(x, y)
    torch.cuda.synchronize()
    ref = x.float() @ m.dense(torch.float32).T
    assert float((y.float() - ref).norm() / ref.norm()) < 5e-3


def test_the_x16_rule_follows_the_serving_measurements():
    """prefers_x16 encodes the H200 serving sweep (benchmarks/RESULTS.md, session 6): q4b32 from 2048^2 up;
    int8 above 4096^2, or K >= 8192 with N >= 2048; the small matrices stay on the bf16 path."""
    assert cd.prefers_x16("q4b32", 2048, 2048) and not cd.prefers_x16("q4b32", 960, 2560)
    assert cd.prefers_x16("q4b32", 49152, 2048) and cd.prefers_x16("q4b32", 8192, 2048)
    assert not cd.prefers_x16("int8", 4096, 4096) and not cd.prefers_x16("int8", 8192, 2048)
    assert cd.prefers_x16("int8", 2048, 8192) and cd.prefers_x16("int8", 11008, 4096)
    assert cd.prefers_x16("int8", 49152, 2048) and not cd.prefers_x16("int8", 960, 960)


def test_a_padded_q4b32_matrix_is_the_unpadded_one():
    """The fused step stores a q4b32 matrix whose K is not a multiple of 128 with zero columns up
    to the next one: zero blocks quantize to exactly 0 and leave the real blocks' scales alone,
    so the padded matrix's first K columns are the unpadded quantization, and the rest is 0."""
    from ledger.kernels import qlinear

    g = torch.Generator().manual_seed(4)
    w = torch.randn(48, 576, generator=g)
    kp = cd.padded_k("q4b32", 576)
    assert (kp, cd.padded_k("q4b32", 640), cd.padded_k("int8", 576)) == (640, 640, 576)
    q, s = qlinear.quantize(torch.cat([w, w.new_zeros(48, kp - 576)], 1), "q4b32")
    m = cd.Matrix("q4b32", 48, 576, q, s, kp=kp)
    full = qlinear.dequantize(q, s, "q4b32", torch.float32)
    assert torch.equal(full[:, 576:], torch.zeros(48, kp - 576))
    assert torch.equal(m.dense(torch.float32), qlinear.dequantize(*qlinear.quantize(w, "q4b32"), "q4b32", torch.float32))
    assert cd.Matrix("int8", 2, 64, torch.zeros(2, 64), torch.ones(2)).kp == 64


def test_the_fused_step_refuses_shapes_it_cannot_take():
    cfg, _ = _base()
    shape = gen.Shape.of(cfg)
    assert cd.step_unmet(shape, 512) is None
    assert "context" in cd.step_unmet(shape, cd.MAX_STEP_CONTEXT + 1)
    import dataclasses

    assert "head_dim" in cd.step_unmet(dataclasses.replace(shape, head_dim=384), 64)
    assert "hidden" in cd.step_unmet(dataclasses.replace(shape, hidden=16384), 64)
    # on the CPU the step is torch's, and says why
    d = cd.CudaLlama(_base()[1], shape, "bf16", device="cpu", dtype=torch.float32, graphs=False, context=64)
    assert d.step is None and d.step_realization.startswith("torch (")
    from ledger.errors import RealizationUnavailable

    with pytest.raises(RealizationUnavailable):
        cd.CudaLlama(_base()[1], shape, "bf16", device="cpu", dtype=torch.float32, graphs=False, context=64,
                     fused_step=True)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["bf16", "int8", "q4b32"])
def test_the_fused_step_is_the_torch_step(fmt):
    """The fused decode step (ledger/kernels/decode_step.cu) against the torch step on the same
    weights and cache: hidden 192 and MLP 320 (q4b32 pads both to multiples of 128), head_dim 48,
    grouped-query heads; the logits of one step, the cache it wrote, and greedy decoding through
    the captured graph against the same fused step run without a graph (bit for bit)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    cfg, sd = _base(intermediate=320, hidden=192, heads=4, kv_heads=2)
    shape = gen.Shape.of(cfg)
    lora, acfg = _adapter(sd)
    fused = cd.CudaLlama(sd, shape, fmt, device="cuda", context=64)
    ref = cd.CudaLlama(sd, shape, fmt, device="cuda", context=64, graphs=False, fused_step=False,
                       kernels=fused.kernels)
    nograph = cd.CudaLlama(sd, shape, fmt, device="cuda", context=64, graphs=False, kernels=fused.kernels)
    for d in (fused, ref, nograph):
        d.load(lora, acfg)
    assert fused.step is not None and fused.step_realization.startswith("ledger:decode-step")
    assert ref.step is None
    if fmt == "q4b32":   # every matrix on the kernel, the K-padded ones recorded as such
        assert fused.realizations["layers.0.qkv"].endswith("K 192->256")
        assert fused.realizations["layers.0.down"].endswith("K 320->384")
        assert all(v.startswith("ledger:") for v in fused.realizations.values())
    ids = [5, 17, 42, 7, 99]
    with torch.inference_mode():
        for d in (fused, ref):
            d.k_cache.zero_()
            d.v_cache.zero_()
            d._forward(torch.tensor(ids, device="cuda"), torch.arange(5, device="cuda"))
        fused._tok.fill_(11)
        fused._pos.fill_(5)
        fused._step_fused()
        a = fused._logits[0].float()
        b = ref._forward(torch.tensor([11], device="cuda"), torch.tensor([5], device="cuda")).float()
        torch.cuda.synchronize()
    assert float((a - b).norm() / b.norm()) < 0.02
    assert int(fused._pos) == 6 and int(fused._tok) == int(a.argmax()) == int(fused._out[6])
    for c in ("k_cache", "v_cache"):
        x, y = getattr(fused, c)[:, :, :6].float(), getattr(ref, c)[:, :, :6].float()
        assert float((x - y).norm() / y.norm()) < 0.01
    assert fused.decode(ids, 24) == nograph.decode(ids, 24)
    assert fused._graph and not nograph._graph
