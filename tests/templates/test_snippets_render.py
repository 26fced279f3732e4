"""Rendering fix snippets: the registry, the user's names, and rejected input."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import jinja2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradient_doctor.knowledge.models import SNIPPET_IDS
from gradient_doctor.templates import environment
from gradient_doctor.templates.snippets import (
    STANDARD_PARAMETERS,
    SnippetSpec,
    list_snippets,
    render_snippet,
)

# The snippet ids shared with the knowledge entries (the common notes): a contract, so it is
# spelled out here on purpose.
CONTRACT_IDS = {
    "clip-norm",
    "training-loop-order",
    "accumulation",
    "accumulation-clip",
    "accumulation-scheduler",
    "accumulation-leftover",
    "accumulation-token-mean",
    "amp-clip",
    "amp-accumulation-clip",
    "ddp-no-sync-accumulation",
    "grad-norm-monitor",
    "nan-check-order",
    "stable-loss-ops",
    "vanishing-fixes",
    "dead-relu-fixes",
    "max-norm-tuning",
    "lightning-clipping",
    "per-layer-clipping",
    "checkpointing-with-clipping",
    "value-to-norm-clipping",
}

SPECS = list_snippets()
SPEC_IDS = [spec.id for spec in SPECS]

# Custom values per parameter; dotted names on purpose for some, and values that differ from
# every default.
CUSTOM_NAMES: dict[str, str | int | float] = {
    "model": "self.net",
    "optimizer": "opt",
    "loss": "batch_loss",
    "criterion": "loss_fn",
    "scaler": "amp_scaler",
    "loader": "micro_batches_iter",
    "scheduler": "lr_sched",
    "accumulation_steps": "cfg.grad_accum",
    "max_norm": 0.25,
    "device_type": "cpu",
    "dtype": "torch.float16",
    "inputs": "x_batch",
    "targets": "y_batch",
    "step": "batch_idx",
    "epoch": "ep",
    "trainer": "pl_trainer",
    "num_epochs": "cfg.epochs",
    "ignore_index": -1,
}


def dotted_names(code: str) -> set[str]:
    """Every name and dotted attribute chain (and its prefixes) used in ``code``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        parts: list[str] = []
        current: ast.expr = node  # type: ignore[assignment]
        while isinstance(current, ast.Attribute):
            parts.append(current.attr)
            current = current.value
        if isinstance(current, ast.Name):
            parts.append(current.id)
            parts.reverse()
            found.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    return found


def typed(value: object) -> tuple[str, object]:
    """A value keyed with its type, so that 1 and 1.0 stay apart."""
    return type(value).__name__, value


def literals(code: str) -> set[tuple[str, object]]:
    """Every constant in ``code`` (typed), with negated numbers folded in."""
    values: set[tuple[str, object]] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Constant):
            values.add(typed(node.value))
        elif (
            isinstance(node, ast.UnaryOp)
            and isinstance(node.op, ast.USub)
            and isinstance(node.operand, ast.Constant)
            and isinstance(node.operand.value, int | float)
        ):
            values.add(typed(-node.operand.value))
    return values


def with_prefixes(dotted: set[str]) -> set[str]:
    """``{"torch.bfloat16"}`` -> ``{"torch", "torch.bfloat16"}``."""
    parts = [name.split(".") for name in dotted]
    return {".".join(chain[: i + 1]) for chain in parts for i in range(len(chain))}


def test_registry_holds_exactly_the_contract_ids() -> None:
    assert set(SPEC_IDS) == CONTRACT_IDS
    # The knowledge schema validates entries' snippet references against its own copy.
    assert set(SPEC_IDS) == set(SNIPPET_IDS)
    assert sorted(SPEC_IDS) == SPEC_IDS


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_spec_is_complete(spec: SnippetSpec) -> None:
    assert spec.title and spec.description
    assert spec.related, "a snippet must say which catalogue entries it fixes"
    assert all(re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", rid) for rid in spec.related)
    for name, parameter in spec.parameters.items():
        if name in STANDARD_PARAMETERS:
            assert parameter == STANDARD_PARAMETERS[name]
        assert parameter.description


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_parameters_are_the_variables_the_template_uses(spec: SnippetSpec) -> None:
    env = environment()
    assert env.loader is not None
    source, _, _ = env.loader.get_source(env, f"snippets/{spec.id}.py.j2")
    used = jinja2.meta.find_undeclared_variables(env.parse(source))
    assert set(spec.parameters) == used


def test_related_ids_exist_in_the_knowledge_base() -> None:
    knowledge = pytest.importorskip("gradient_doctor.knowledge")
    try:
        base = knowledge.load_knowledge()
    except Exception as error:  # the knowledge data is written by another helper
        pytest.skip(f"knowledge base not loadable yet: {error}")
    missing = {
        spec.id: [rid for rid in spec.related if rid not in base.entries]
        for spec in SPECS
        if any(rid not in base.entries for rid in spec.related)
    }
    assert not missing


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_renders_with_defaults_to_valid_python(spec: SnippetSpec) -> None:
    code = render_snippet(spec.id)
    names = dotted_names(code)
    for name, parameter in spec.parameters.items():
        if parameter.kind == "name" or name in {"accumulation_steps", "num_epochs"}:
            assert parameter.default in names, name
    assert not code.startswith("\n") and "{{" not in code and "{#" not in code


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_custom_names_replace_every_default(spec: SnippetSpec) -> None:
    custom = {name: CUSTOM_NAMES[name] for name in spec.parameters}
    default_code = render_snippet(spec.id)
    code = render_snippet(spec.id, custom)
    names, values = dotted_names(code), literals(code)
    default_names, default_values = dotted_names(default_code), literals(default_code)
    for name, parameter in spec.parameters.items():
        value = custom[name]
        if isinstance(value, str) and parameter.kind != "string":
            assert value in names, name
            assert parameter.default not in names, f"{name}: default {parameter.default} left"
        else:
            assert typed(value) in values, name
            default_value = typed(ast.literal_eval(parameter.default))
            assert default_value in default_values
            assert default_value not in values, f"{name}: default {parameter.default} left"
    # Only the parameters changed: every name that went away was (or hangs off) a default.
    assert len(code.splitlines()) == len(default_code.splitlines())
    defaults = with_prefixes({p.default for p in spec.parameters.values()})
    gone = default_names - names
    assert all(chain.split(".")[0] in defaults or chain in defaults for chain in gone), gone


def test_numbers_and_device_words_are_rendered_as_literals() -> None:
    code = render_snippet(
        "amp-accumulation-clip",
        {"accumulation_steps": 8, "max_norm": "0.5", "device_type": '"cpu"'},
    )
    assert "scale(loss / 8)" in code and "% 8 == 0" in code
    assert "max_norm=0.5)" in code
    assert 'GradScaler("cpu")' in code and 'device_type="cpu"' in code
    assert 'device_type="cuda"' in render_snippet("amp-clip")
    # A name that is not a device word is a variable holding the device type.
    assert "device_type=device.type" in render_snippet("amp-clip", {"device_type": "device.type"})
    assert "ignore_index=-100" in render_snippet("accumulation-token-mean")
    assert "max_norm=2)" in render_snippet("clip-norm", {"max_norm": 2})


def test_unused_standard_names_are_accepted_and_ignored() -> None:
    plain = render_snippet("clip-norm")
    assert render_snippet("clip-norm", {"scaler": "amp_scaler", "trainer": "t"}) == plain


def test_unknown_snippet_names_the_closest_ids() -> None:
    with pytest.raises(KeyError, match="clip-norm"):
        render_snippet("clip-nrom")
    with pytest.raises(KeyError, match="accumulation"):
        render_snippet("acumulation-clipping")


def test_unknown_parameter_names_the_accepted_ones() -> None:
    with pytest.raises(ValueError, match=r"modle.*accepts: model, optimizer, loss, max_norm"):
        render_snippet("clip-norm", {"modle": "net"})


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("model", "model; import os"),
        ("model", "os.system('rm -rf /')"),
        ("model", "1model"),
        ("model", "a..b"),
        ("model", "self.model."),
        ("model", ""),
        ("model", "class"),
        ("model", "self.lambda"),
        ("model", "net\nimport os"),
        ("model", 3),
        ("loader", "loaders[0]"),
        ("max_norm", "1e400"),
        ("max_norm", float("nan")),
        ("max_norm", -1.0),
        ("max_norm", 0),
        ("max_norm", True),
        ("max_norm", "1.0 + __import__('os').getpid()"),
        ("accumulation_steps", 0),
        ("accumulation_steps", 2.5),
        ("accumulation_steps", "4; x = 1"),
        ("device_type", '"cu da"'),
        ("device_type", '"cuda"); import os; ("'),
        ("device_type", 7),
        ("dtype", "torch.bfloat16()"),
    ],
)
def test_bad_values_are_rejected(name: str, value: object) -> None:
    snippet = "amp-accumulation-clip"
    with pytest.raises(ValueError, match=name):
        render_snippet(snippet, {name: value})  # type: ignore[dict-item]


def test_integer_parameters_accept_negative_numbers_only_where_meant() -> None:
    assert "ignore_index=-1," in render_snippet("accumulation-token-mean", {"ignore_index": "-1"})
    with pytest.raises(ValueError, match="ignore_index"):
        render_snippet("accumulation-token-mean", {"ignore_index": 0.5})


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30))
def test_any_accepted_name_is_inserted_as_one_python_name(value: str) -> None:
    try:
        code = render_snippet("accumulation-clip", {"model": value})
    except ValueError:
        return
    # Whatever got through is exactly one (dotted) name in otherwise unchanged code.
    assert value.strip() in dotted_names(code)
    assert len(code.splitlines()) == len(render_snippet("accumulation-clip").splitlines())


def test_rendering_never_imports_torch() -> None:
    # The MCP server renders snippets and must start without torch.
    script = (
        "import sys\n"
        "from templates.snippets import list_snippets, render_snippet\n"
        "for spec in list_snippets():\n"
        "    render_snippet(spec.id)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
