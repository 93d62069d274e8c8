"""The typed plan view (ledger/plan/plan.py): every plan shape compile writes round-trips through
it unchanged (same id), and an ill-shaped body is refused naming the field."""

from __future__ import annotations

import copy
import dataclasses
import re
import typing

import pytest

from ledger.errors import SpecError
from ledger.plan import compile as comp
from ledger.plan import plan as planlib
from ledger.plan import spec, targets
from ledger.plan.spec import SCHEMA
from ledger.store import canonical
from ledger.store.ids import hash_bytes
from tests.plan.test_gpu_plan import DECODE, H200, _tiny_turn_dataset, gate_for

TINY = "[data]\nsteps = 12\nmicro_batch = 8\n[train]\ncheckpoint_every = 4\n"


def _round_trips(plan: comp.Plan) -> planlib.Plan:
    view = planlib.Plan.from_json(plan.body)
    again = view.to_json()
    assert again == plan.body
    assert hash_bytes(canonical.dumps(again)) == plan.id
    assert plan.view == view  # compile builds the same view once, with the plan
    return view


@pytest.mark.parametrize("text, target", [
    (TINY, "cpu"),                                                        # the tiny CPU plan
    ("[data]\nsteps = 2\n[train]\ndevices = 2\n", "cpu"),                # DDP over gloo
    ('[data]\nsteps = 2\n[precision]\ndtype = "bf16"\n', "h200"),        # torch-compiled, bf16 autocast
    ("[data]\nsteps = 2\n[train]\ndevices = 2\n", "h200"),               # DDP over NCCL
])
def test_every_plan_shape_round_trips_with_the_same_id(store, text, target):
    plan = comp.compile_spec(store, spec.parse(text), targets.get(target)).plan
    view = _round_trips(plan)
    assert view.config.data.steps == plan.body["config"]["data"]["steps"]
    assert view.devices == plan.body["config"]["train"]["devices"]
    assert view.cuda == (target != "cpu")
    lines = {x["name"]: x["bytes"] for x in plan.body["memory"]["lines"]}
    assert view.memory.line("adapter") == lines["adapter"] and view.memory.line("no such line") == 0
    assert comp.load(store, plan.id).view == view


def test_a_fused_plan_round_trips(store, monkeypatch):
    monkeypatch.setattr(comp, "_cupy_here", lambda: None)
    gate_for(store, monkeypatch)
    data = _tiny_turn_dataset(store)
    plan = comp.compile_spec(store, spec.parse(DECODE.replace("[data]\n", f'[data]\ndataset = "{data}"\n')), H200).plan
    view = _round_trips(plan)
    assert view.uses("cupy-fused") and view.realizations["linear_lora"].code_object


def test_the_config_view_has_every_spec_field():
    """One view class per spec section, one field per SCHEMA field (plan/spec.py)."""
    hints = typing.get_type_hints(planlib.Config)
    assert {f.name for f in dataclasses.fields(planlib.Config)} == set(SCHEMA)
    for name, section in SCHEMA.items():
        assert {f.name for f in dataclasses.fields(hints[name])} == set(section), name


def test_old_plans_without_later_fields_round_trip_too(store):
    """Fields added within plan version 1 (devices, loop, ...) may be absent from stored plans."""
    body = copy.deepcopy(comp.compile_spec(store, spec.parse(TINY), targets.get("cpu")).plan.body)
    for k in ("loop", "devices", "autocast", "launcher"):
        del body["runtime"][k]
    del body["config"]["train"]["devices"]
    view = planlib.Plan.from_json(body)
    assert view.to_json() == body
    assert view.devices == 1 and view.runtime.loop_kind == "eager" and view.runtime.autocast is planlib.ABSENT


@pytest.mark.parametrize("edit, field, what", [
    (lambda b: b["shapes"].update(micro_batch="16"), "shapes.micro_batch", "expected an integer"),
    (lambda b: b["config"]["data"].update(seq_len=96.0), "config.data.seq_len", "expected an integer"),
    (lambda b: b["config"]["lora"].update(dropout=True), "config.lora.dropout", "expected a number"),
    (lambda b: b["runtime"].update(threads=None), "runtime.threads", "expected an integer"),
    (lambda b: b["config"]["optimizer"].update(betas=[0.9]), "config.optimizer.betas", "expected 2 items"),
    (lambda b: b["memory"]["lines"][2].pop("bytes"), "memory.lines[2].bytes", "missing"),
    # (compile shares one realization dict between operators: replace, do not edit in place)
    (lambda b: b["realizations"].update(attention={**b["realizations"]["attention"], "extra": 1}),
     "realizations.attention.extra", "unknown field"),
    (lambda b: b.update(surprise={}), "surprise", "unknown field"),
    (lambda b: b.pop("fit"), "fit", "missing"),
    (lambda b: b["inputs"].update(base=7), "inputs.base", "expected a string"),
    (lambda b: b["shapes"]["lora_modules"].update(q_proj=[64]), "shapes.lora_modules.q_proj", "expected 2 items"),
    (lambda b: b.update(kind="receipt"), "kind", 'expected "plan"'),
    (lambda b: b.update(version=2), "version", "plan version 1"),
])
def test_an_ill_shaped_body_is_refused_naming_the_field(store, edit, field, what):
    body = copy.deepcopy(comp.compile_spec(store, spec.parse(TINY), targets.get("cpu")).plan.body)
    edit(body)
    with pytest.raises(SpecError) as ei:
        planlib.Plan.from_json(body)
    e = ei.value
    assert e.exit_code == 2 and e.details["field"] == field and f"plan field `{field}`" in e.message
    assert what in e.message
    # a stored object of that shape is refused where it is read, before anything runs
    with store.transaction("add") as tx:
        oid = tx.put_json(body)
        tx.outputs.append(oid)
    with pytest.raises(SpecError, match=re.escape(f"`{field}`")):
        comp.load(store, oid)
