import json

import pytest

from ledger.errors import CompileRejected, RealizationUnavailable, SpecError
from ledger.plan import compile as comp
from ledger.plan import memory, spec, targets
from ledger.plan.plan import Config
from ledger.plan.spec import LLAMA_MODULES

SMALL = "[data]\nsteps = 4\nmicro_batch = 4\n"
TOO_BIG = """
[model]
hidden = 1024
layers = 8
heads = 16
kv_heads = 16
intermediate = 2816
max_positions = 2048
[data]
seq_len = 1024
micro_batch = 64
"""


def test_same_inputs_same_plan_id_and_one_record(store):
    s = spec.parse(SMALL)
    a = comp.compile_spec(store, s, targets.get("cpu"))
    seq = store.state.seq
    b = comp.compile_spec(store, spec.parse(SMALL), targets.get("cpu"))
    assert a.new and not b.new and a.plan.id == b.plan.id
    assert store.state.seq == seq  # nothing new to record the second time
    rec = a.record
    assert rec["kind"] == "compile" and rec["payload"]["plan"] == a.plan.id and a.plan.id in rec["outputs"]
    assert comp.load(store, a.plan.id).body == a.plan.body
    body = store.get_json(a.plan.id)
    for key in ("config", "shapes", "parameters", "memory", "realizations", "fit", "inputs", "runtime"):
        assert key in body
    assert body["config"]["compile"]["target"] == "cpu"
    assert all(r["name"] == "torch-eager" for r in body["realizations"].values())
    assert body["memory"]["total_bytes"] == sum(x["bytes"] for x in body["memory"]["lines"])
    names = [x["name"] for x in body["memory"]["lines"]]
    assert names == ["weights", "adapter", "gradients", "optimizer_state", "data", "activations", "workspace"]


def test_parameter_counts_match_the_real_model(store):
    """The planner counts parameters from the config alone; peft must agree exactly."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from ledger.artefacts import model

    s = spec.parse("[model]\nhidden = 32\nheads = 4\nkv_heads = 2\nintermediate = 48\n[lora]\nr = 4\n"
                   "target_modules = ['q_proj', 'v_proj', 'down_proj']\n")
    plan = comp.compile_spec(store, s, targets.get("cpu")).plan
    cfg = model.builtin_config(s.config["model"])
    m = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")}))
    assert sum(p.numel() for p in m.parameters()) == plan.body["parameters"]["base"]
    pm = get_peft_model(m, LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"]))
    trainable = sum(p.numel() for p in pm.parameters() if p.requires_grad)
    assert trainable == plan.body["parameters"]["trainable"]
    assert sum(p.numel() for p in pm.parameters()) == plan.body["parameters"]["total"]
    del torch


def test_rejection_names_memory_and_nearest_fit_and_writes_nothing(store):
    seq = store.state.seq
    n_objects = sum(1 for _ in store.objects.iter_ids())
    with pytest.raises(CompileRejected) as e:
        comp.compile_spec(store, spec.parse(TOO_BIG), targets.get("rtx3070-8gb"))
    err = e.value
    assert err.exit_code == 3 and err.details["requirement"] == "memory"
    assert "rtx3070-8gb has 8.00 GiB" in err.message and "largest micro-batch that fits" in err.message
    assert store.state.seq == seq and sum(1 for _ in store.objects.iter_ids()) == n_objects
    near = err.details["nearest"]["data.micro_batch"]
    assert 1 <= near < 64
    # the nearest configuration really fits, and one more does not
    fits = spec.parse(TOO_BIG).with_overrides({"data.micro_batch": near})
    over = spec.parse(TOO_BIG).with_overrides({"data.micro_batch": near + 1})
    t = targets.get("rtx3070-8gb")
    arch = comp.model.arch_of(comp.model.builtin_config(fits.config["model"]))
    comp.fit_check(arch, Config.from_json(fits.config), t, 4000)
    with pytest.raises(CompileRejected):
        comp.fit_check(arch, Config.from_json(over.config), t, 4000)


def test_memory_lines_scale_with_micro_batch():
    from ledger.artefacts import model

    arch = model.arch_of(model.builtin_config(spec.parse("").config["model"]))
    kw = dict(r=8, modules=LLAMA_MODULES, dropout=0.0, dtype="fp32", seq_len=64, dataset_rows=10)
    one = {x.name: x.bytes for x in memory.lines(arch, micro_batch=1, **kw)}
    four = {x.name: x.bytes for x in memory.lines(arch, micro_batch=4, **kw)}
    assert four["activations"] == 4 * one["activations"] and four["workspace"] == 4 * one["workspace"]
    assert four["weights"] == one["weights"] and four["optimizer_state"] == one["optimizer_state"]


def test_dtype_and_realization_requirements(store):
    with pytest.raises(CompileRejected) as e:
        comp.compile_spec(store, spec.parse('[precision]\ndtype = "fp16"\n'), targets.get("cpu"))
    assert e.value.details["requirement"] == "precision.dtype"
    with pytest.raises(CompileRejected) as e:
        comp.compile_spec(store, spec.parse('[compile]\nrealization = "cupy-fused"\n'), targets.get("cpu"))
    assert "requires a CUDA target" in e.value.message
    try:
        import cupy  # noqa: F401
        pytest.skip("cupy is installed here")
    except ImportError:
        pass
    with pytest.raises(CompileRejected) as e:
        comp.compile_spec(store, spec.parse('[compile]\nrealization = "cupy-fused"\n'), targets.get("h200"))
    assert e.value.details["requirement"] == "realization.cupy-fused.available"


def test_explain_names_what_changed(store):
    a = comp.compile_spec(store, spec.parse(SMALL), targets.get("cpu")).plan
    b = comp.compile_spec(store, spec.parse(SMALL + "[lora]\nr = 16\n"), targets.get("cpu")).plan
    d = comp.explain(a, b)
    assert not d["same"]
    assert d["config"] == [{"field": "lora.r", "old": 8, "new": 16}]
    parts = {x["part"] for x in d["derived"]}
    assert {"parameters.trainable", "memory.adapter", "memory.optimizer_state", "memory.activations"} <= parts
    assert "memory.weights" not in parts and "inputs.base" not in parts
    assert comp.explain(a, a)["same"]
    json.dumps(d)


def test_unknown_builtin_and_seq_len_too_short(store):
    with pytest.raises(SpecError):
        comp.compile_spec(store, spec.parse('[model]\nbase = "builtin:huge"\n'), targets.get("cpu"))
    with pytest.raises(SpecError) as e:
        comp.compile_spec(store, spec.parse("[data]\nseq_len = 40\n"), targets.get("cpu"))
    assert e.value.details["field"] == "data.seq_len"


def test_cuda_plan_never_falls_back_to_cpu(store):
    """Selection is not fallback: a CUDA plan on a machine without CUDA fails loudly."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from ledger.train import run as trainlib
    from ledger.train import sft

    plan = comp.compile_spec(store, spec.parse(SMALL), targets.get("h200")).plan
    assert all(r["device"] == "cuda" for r in plan.body["realizations"].values())
    seq = store.state.seq
    with pytest.raises(RealizationUnavailable) as e:
        trainlib.train(store, plan.id)
    assert e.value.exit_code == 3 and "no CUDA device" in e.value.message
    assert store.state.seq == seq  # nothing trained, nothing recorded
    # the child refuses on its own too (it is where the plan executes)
    with pytest.raises(RealizationUnavailable):
        sft.check_realizations(plan.view)


@pytest.mark.parametrize("extra", [{}, {"lora.target_modules": ["q_proj", "v_proj"], "lora.r": 2},
                                   {"model.kv_heads": 2, "lora.dropout": 0.1},
                                   {"precision.dtype": "bf16"}, {"precision.dtype": "bf16", "model.kv_heads": 2},
                                   {"precision.dtype": "bf16", "lora.target_modules": ["q_proj", "v_proj"]},
                                   {"precision.dtype": "bf16", "model.kv_heads": 2, "precision.base_quant": "q4b32"},
                                   {"precision.dtype": "bf16", "lora.dropout": 0.1}])
def test_activation_line_matches_what_autograd_saves(tmp_path, extra):
    """The plan's activations line against the bytes autograd really keeps for backward,
    counted storage by storage with saved_tensors_hooks on a real forward -- an fp32 base, and a
    bf16 one (the torch-eager realization on a GPU; quantized too), whose fp32 norm upcasts and
    per-module fp32 LoRA inputs the fp32 formula does not have."""
    import torch

    from ledger.artefacts import model
    from ledger.plan.plan import Config
    from ledger.train import sft

    s = spec.parse("[model]\nhidden = 64\nlayers = 2\nintermediate = 96\n[data]\nmicro_batch = 4\nseq_len = 32\n")
    s = s.with_overrides(extra)
    model.build_builtin_files(s.config["model"], tmp_path)
    m, _ = sft.build(Config.from_json(s.config), tmp_path)
    m.train()
    ids = torch.randint(0, 256, (4, 32))
    mask = torch.ones(4, 32, dtype=torch.long)
    params = {p.untyped_storage().data_ptr() for p in m.parameters()}
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        m(input_ids=ids, attention_mask=mask, labels=ids)
    saved = sum(seen.values())
    arch = model.arch_of(model.builtin_config(s.config["model"]))
    c = s.config
    dtype = c["precision"]["dtype"]
    # an all-ones mask: no batch is padded (the fp32 formula counts a mask all the same); on the
    # CPU, dropout keeps an fp32 noise tensor (device "cpu")
    planned = {x.name: x.bytes for x in memory.lines(arch, r=c["lora"]["r"], modules=c["lora"]["target_modules"],
                                                     dropout=c["lora"]["dropout"], dtype=dtype, micro_batch=4,
                                                     seq_len=32, dataset_rows=0, padded=dtype == "fp32",
                                                     base_quant=c["precision"]["base_quant"])
               }["activations"]
    assert abs(planned - saved) / saved < 0.12, (planned, saved)
