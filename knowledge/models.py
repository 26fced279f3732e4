"""Typed knowledge entries. Data files in ``knowledge/data/`` are validated against these.

Every catalogue identifier (``../shared/catalog.md`` §1–§4) is exactly one entry. Entries are
written in the project's own words; each names where its facts come from (seed file +
section) so a reader can check them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from gradient_doctor.knowledge.findings import Severity

EntryId = Annotated[str, Field(pattern=r"^[a-z0-9]+(-[a-z0-9]+)*$")]
EntryKind = Literal["red-flag", "signal", "rationalization", "symptom"]
Where = Literal["S", "R", "T"]

#: The fix snippets shipped in ``templates/snippets`` (a fixed list shared with the templates).
SNIPPET_IDS: frozenset[str] = frozenset(
    {
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
)

SEED_FILES: dict[str, str] = {
    "CG": "000_e5257207b403cb55.txt",
    "GM": "001_854112de044e240f.txt",
    "GS": "003_f927da5ad9d5d282.txt",
    "TD": "004_bb85451bd50ce9db.txt",
}


class _Strict(BaseModel):
    # defer_build: the validators are built on first validation, not at import. The runtime
    # probe reads the validated knowledge base from its cache (``knowledge.loader``) and never
    # validates one of these models, which saves it building them (some 10 ms of CPU).
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class SourceRef(_Strict):
    """Where a fact comes from: a seed (by its catalogue short name) and a section heading."""

    seed: Literal["CG", "GM", "GS", "TD", "real-world", "torch"] = Field(
        description="CG/GM/GS/TD are the seed documents; 'torch' means checked by running "
        "PyTorch (see the test named in `note`); 'real-world' a public bug report."
    )
    section: str
    note: str | None = None

    def render(self) -> str:
        file = SEED_FILES.get(self.seed)
        where = f"{self.seed} ({file})" if file else self.seed
        return f"{where}, {self.section}" + (f" — {self.note}" if self.note else "")


class EntryBase(_Strict):
    id: EntryId
    kind: EntryKind
    title: str = Field(description="Short human title.")
    summary: str = Field(description="One sentence: what this entry is about.")
    sources: list[SourceRef] = Field(min_length=1)
    related: list[EntryId] = Field(default_factory=list, description="Related entry ids.")
    snippets: list[str] = Field(default_factory=list, description="Fix snippet ids.")
    keywords: list[str] = Field(
        default_factory=list, description="Extra words and phrases the matcher should know."
    )

    @property
    def severity_or_none(self) -> Severity | None:
        return getattr(self, "severity", None)

    @property
    def source_text(self) -> str:
        return "; ".join(s.render() for s in self.sources)


class RedFlag(EntryBase):
    """A mistake in the training code (catalogue §1)."""

    kind: Literal["red-flag"] = "red-flag"
    severity: Severity
    where: list[Where] = Field(min_length=1)
    what: str
    why: str
    shows_up: list[str] = Field(min_length=1, description="How it shows up in training.")
    confirm: list[str] = Field(min_length=1, description="How to confirm it.")
    fix: str
    rationalizations: list[EntryId] = Field(default_factory=list)
    seed_correction: str | None = Field(
        default=None, description="Where a seed is wrong about this, what is true."
    )


class Signal(EntryBase):
    """A runtime measurement pattern (catalogue §2)."""

    kind: Literal["signal"] = "signal"
    severity: Severity = Field(
        description="The catalogue's severity (catalog.md §2): the higher level for signals "
        "listed with two; `severities` lists every level the probe may report."
    )
    severities: list[Severity] = Field(min_length=1)
    what: str
    why: str
    shows_up: list[str] = Field(min_length=1)
    confirm: list[str] = Field(min_length=1)
    fix: str
    rationalizations: list[EntryId] = Field(default_factory=list)
    thresholds: list[str] = Field(
        default_factory=list, description="Threshold keys (thresholds.yaml) this signal uses."
    )


class Rationalization(EntryBase):
    """A tempting claim an assistant should not make (catalogue §3, in table order)."""

    kind: Literal["rationalization"] = "rationalization"
    number: int = Field(ge=1, le=28)
    claim: str = Field(description="The tempting claim, in short.")
    paraphrases: list[str] = Field(min_length=3, description="Other ways people put it.")
    say_instead: str
    red_flags: list[EntryId] = Field(default_factory=list)


class Symptom(EntryBase):
    """Something a user writes (catalogue §4)."""

    kind: Literal["symptom"] = "symptom"
    description: str
    phrasings: list[str] = Field(min_length=2, description="How users describe it.")
    causes: list[EntryId] = Field(default_factory=list, description="Likely causes, in order.")
    first_checks: list[str] = Field(min_length=1)
    pointer: str | None = Field(default=None, description="Where to look instead (out of scope).")


Entry = Annotated[RedFlag | Signal | Rationalization | Symptom, Field(discriminator="kind")]


class ThresholdValue(_Strict):
    """One number of a threshold profile and the seed it comes from."""

    value: float
    source: SourceRef


class ThresholdProfile(_Strict):
    """A named set of numbers the runtime diagnosis uses.

    The seeds disagree (catalogue §2); each profile keeps one seed's numbers (or the
    project's reconciled default) and every number records where it comes from.
    Norms are L2 norms of all gradients the optimizer updates.
    """

    name: str
    description: str
    exploding_warning: ThresholdValue = Field(description="Total norm above this: warning.")
    exploding_critical: ThresholdValue = Field(description="Total norm above this: critical.")
    vanishing_warning: ThresholdValue = Field(description="Total norm below this: warning.")
    vanishing_critical: ThresholdValue = Field(description="Total norm below this: critical.")
    early_late_ratio: ThresholdValue = Field(
        description="Late-layer norm / early-layer norm above this: vanishing."
    )
    layer_spread_warning: ThresholdValue = Field(description="Max/min per-layer norm ratio.")
    layer_spread_critical: ThresholdValue
    zero_grad_fraction_warning: ThresholdValue = Field(
        description="Fraction of parameter tensors with an all-zero gradient."
    )
    zero_grad_fraction_critical: ThresholdValue
    dead_fraction_warning: ThresholdValue = Field(description="Fraction of never-firing units.")
    dead_fraction_critical: ThresholdValue
    grad_param_ratio_high: ThresholdValue = Field(description="‖g‖/‖w‖ above this: too large.")
    grad_param_ratio_low: ThresholdValue = Field(description="‖g‖/‖w‖ below this: too small.")
    spike_factor: ThresholdValue = Field(description="Norm / running median above this: spike.")
    clip_active_fraction: ThresholdValue = Field(
        description="Fraction of steps clipped above this: clipping too aggressive."
    )
    amp_skip_fraction: ThresholdValue = Field(
        description="Fraction of GradScaler-skipped steps above this: overflow."
    )
    loss_diverging_warning: ThresholdValue = Field(
        description="Recent loss / best loss of the run above this (and above the first "
        "loss): the loss is diverging (warning)."
    )
    loss_diverging_critical: ThresholdValue = Field(
        description="Recent loss / best loss above this, or a non-finite loss after such a "
        "climb: critical."
    )
    update_ratio_high: ThresholdValue = Field(
        description="‖Δw‖/‖w‖ of a layer's applied update above this on every sampled step: "
        "steps too large."
    )
    update_ratio_low: ThresholdValue = Field(
        description="‖Δw‖/‖w‖ below this on every sampled step: the layer does not move."
    )
    weight_growth_high: ThresholdValue = Field(
        description="A weight layer's norm at the last sampled step / at the first above this, "
        "in at least half of the weight layers: the updates were far too large for the weights "
        "(even when the loss does not climb, as under LayerNorm)."
    )
    clip_cut_factor: ThresholdValue = Field(
        description="Median norm before clipping / max_norm above this (with the clip active "
        "on clip_active_fraction of steps): clipping really cuts every update."
    )
    norm_growth: ThresholdValue = Field(
        description="Total norm growth (last quarter / first quarter of the run) above this "
        "counts as a rise however noisy, even under the exploding threshold."
    )


class MaxNormAdvice(_Strict):
    """Typical ``max_norm`` for one family of architectures."""

    architecture: str
    values: list[float] = Field(description="Typical values, most common first.")
    clip_by_default: bool
    advice: str
    source: SourceRef


class ThresholdSet(_Strict):
    default_profile: str
    profiles: list[ThresholdProfile] = Field(min_length=1)
    max_norm: list[MaxNormAdvice] = Field(min_length=5)
    healthy_range: tuple[float, float] = Field(description="Total norm range called healthy.")

    def profile(self, name: str | None = None) -> ThresholdProfile:
        """The profile called ``name`` (the default profile when None)."""
        wanted = name or self.default_profile
        for p in self.profiles:
            if p.name == wanted:
                return p
        known = ", ".join(p.name for p in self.profiles)
        raise KeyError(f"unknown threshold profile {wanted!r} (known: {known})")


class Guide(_Strict):
    """A topic guide: a longer, Markdown explanation of one area (clipping, AMP, ...)."""

    topic: str
    title: str
    summary: str
    body: str = Field(description="Markdown.")
    sources: list[SourceRef] = Field(min_length=1)
    related: list[EntryId] = Field(default_factory=list)


class NanNode(_Strict):
    """One question of the NaN decision tree."""

    id: EntryId
    question: str
    how_to_check: str
    means: str = Field(description="What the answer tells you.")
    if_yes: EntryId | None = Field(default=None, description="Next node id when the answer is yes.")
    if_no: EntryId | None = Field(default=None, description="Next node id when the answer is no.")
    actions: list[str] = Field(default_factory=list, description="What to do at this node.")
    related: list[EntryId] = Field(default_factory=list, description="Related entry ids.")
    snippets: list[str] = Field(default_factory=list, description="Fix snippet ids.")
    sources: list[SourceRef] = Field(min_length=1)

    @property
    def next_nodes(self) -> list[str]:
        """The ids this node can lead to (yes first)."""
        return [n for n in (self.if_yes, self.if_no) if n]


class NanTree(_Strict):
    """The ordered diagnosis for a non-finite loss: loss → gradients → parameters."""

    title: str
    summary: str
    root: EntryId
    nodes: list[NanNode] = Field(min_length=1)

    def node(self, node_id: str) -> NanNode:
        """The node called ``node_id`` (KeyError when unknown)."""
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)


class SeedCorrection(_Strict):
    """A place where a seed document is wrong or out of date, and what is true (catalogue §5)."""

    id: EntryId
    seed_claim: str = Field(description="What the seed says, in short and in our own words.")
    truth: str = Field(description="What is actually true.")
    mechanics: str = Field(description="Why: the arithmetic or the library behaviour.")
    related: list[EntryId] = Field(default_factory=list)
    test: str = Field(description="The test that proves it (pytest node id).")
    sources: list[SourceRef] = Field(min_length=1)
