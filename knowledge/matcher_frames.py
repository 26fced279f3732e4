"""Quantity/trend frames: what a text says a training quantity *does*, in any vocabulary.

Users describe the same event in very different words: "grad norm explodes then the loss goes
NaN", "the orange line in the grad panel goes through the roof, then the loss chart is blank",
"gnorm shot up 1000x, loss: nan". Word matching needs every phrasing in the index; instead this
module reads each statement as a *frame*: which quantity it is about (the gradient norm, the
loss, the loss scale, the clipping rate …, named as a metric or as the panel, chart, line or
tile that shows it) and what that quantity does (goes vertical, goes blank, a single needle and
back, a flat line at one exact value, pinned at zero, a slow ramp up, a slide to the floor, a
saw blade, a staircase down …). A small table maps (quantity, trend) onto the catalogue entry
the frame describes.

A trend belongs to the quantity named last before it in its sentence ("the gradient panel hugs
the bottom, then goes vertical"), or, when its sentence names none, to the one the previous
sentence was about ("The scaler tile keeps dropping. It now reads 0.004"). When several frames
are read, the earliest event in the text is the cause the later ones follow from ("the grad
panel goes vertical and right after that the loss chart is blank": exploding gradients first).

The frames are evidence beside the words and the numbers (``CodeHit`` with a strength below the
numbers' sure readings); they never read code. Nothing here imports torch.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

from gradient_doctor.knowledge import _regex
from gradient_doctor.knowledge._code import CodeHit
from gradient_doctor.knowledge._text import unwrap_prose

__all__ = ["Frame", "FrameEvidence", "frame_evidence", "frame_hits", "read_frames"]

# -- quantities, named as metrics or as what shows them -------------------------------------

_DISPLAY = r"(?:panel|graph|chart|plot|curve|line|tile|widget|trace|sparkline|bars?|scalar)"

#: Each quantity, in the order they are tried at one position (the longer names first, so
#: "loss scale" is not read as the loss).
_QUANTITIES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "loss_scale",
        _regex.compile(
            r"\b(?:(?:amp\s+|grad(?:ient)?\s+)?loss[\s_-]?scal(?:e|ing)|grad[\s_]?scaler?\b|"
            r"(?:amp\s+)?scaler(?:'s)?(?:\s+(?:value|scale))?|scale\s+factor)\b",
            re.IGNORECASE,
        ),
    ),
    (
        "clip_rate",
        _regex.compile(
            r"\bclip(?:ping|ped)?[\s_-]*(?:counter|count|rate|fraction|frac|ratio|pct|percent(?:age)?|"
            r"events?|activations?|hits?)\b"
            r"|\b(?:fraction|share|percent(?:age)?|number|count)\s+of\s+(?:the\s+)?(?:steps|updates|"
            r"iterations|batches)\s+(?:that\s+(?:were|are|got)\s+)?clipped\b"
            r"|\bclip(?:ping)?\s+(?:at\s+[\d.]+\s+)?(?:engages?|kicks?\s+in|fires?|triggers?|"
            r"activates?)\b",
            re.IGNORECASE,
        ),
    ),
    (
        "grad_norm",
        _regex.compile(
            r"\b(?:total[\s_-]+)?(?:grad(?:ient)?s?[\s_/-]*(?:l2[\s_-]*)?(?:norms?|size|"
            r"magnitudes?)|g[\s_-]?norms?)\b(?:\s+" + _DISPLAY + r")?"
            r"|\bgrad(?:ient)?s?[\s_/-]+" + _DISPLAY + r"\b"
            # "the grads on the critic are huge": the gradients said to be of some size.
            r"|\bgrad(?:ient)?s\b(?=(?:\s+(?:on|of|in|for)\s+[^.;\n]{0,30}?)?\s+(?:are|were|look|"
            r"looked|seem|seemed|got|get|became|become)\b)"
            r"|\b(?:size|magnitude)\s+of\s+(?:the\s+)?grad(?:ient)?s?\b"
            r"|\b(?:the\s+)?(?:orange|blue|green|red|purple|pink|grey|gray)\s+line\s+in\s+the\s+"
            r"grad\w*(?:[\s_-]+norm)?\s+" + _DISPLAY + r"\b",
            re.IGNORECASE,
        ),
    ),
    (
        "loss",
        _regex.compile(
            r"\b(?:train(?:ing)?[\s_/-]*)?loss(?:es)?\b(?!\s*[\s_-]scal)(?:\s+" + _DISPLAY + r")?",
            re.IGNORECASE,
        ),
    ),
)

#: Held-out losses are not the training loss a trend frame reads ("val loss climbs" is another
#: story: the words and numbers handle it).
_HELD_OUT_BEFORE = _regex.compile(
    r"\b(?:val(?:idation)?|eval|test|dev|held[-\s]?out)[\s_/-]*$", re.I
)

# -- trends ---------------------------------------------------------------------------------

_NUMBER = r"(?:\d+(?:\.\d+)?(?:e[-+]?\d+)?)"

#: Trend name → pattern. Order matters only for overlapping spans: the first listed wins.
_TRENDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        # One point far above the rest and straight back: needles, weeds, blips.
        "needle",
        _regex.compile(
            # Not a histogram's "needle at zero" (values bunched at 0, not one spike).
            r"\b(?:needles?|weeds?|lone\s+spikes?|isolated\s+spikes?|single\s+spikes?)\b"
            r"(?!\s+(?:at|on|around)\s+(?:zero|0)\b)"
            r"|\b(?:the\s+)?(?:very\s+)?next\s+(?:step|iteration|one)\s+(?:it'?s|it\s+is|is|goes|"
            r"falls|drops|comes|snaps)\s+(?:right\s+|straight\s+)?back\b"
            r"|\b(?:one|a)\s+single\s+(?:point|step|value)\b"
            r"|\b(?:falls?|drops?|comes?|snaps?|goes)\s+(?:right|straight|immediately)\s+back\b"
            r"|\bback\s+(?:down\s+)?(?:to\s+(?:normal|~?\s*" + _NUMBER + r")\s+)?(?:on\s+)?the\s+"
            r"(?:very\s+)?next\s+step\b",
            re.IGNORECASE,
        ),
    ),
    (
        "sawtooth",
        _regex.compile(
            r"\bsaw[\s-]?(?:tooth|teeth|blade)\b|\bteeth\b|\bzig[\s-]?zags?\b",
            re.IGNORECASE,
        ),
    ),
    (
        # Off the top: the quantity explodes.
        "vertical",
        _regex.compile(
            r"\bgo(?:es|ing)?\s+vertical\b|\bwent\s+vertical\b|\bthrough\s+the\s+roof\b"
            r"|\b(?:shoots?|shot|rockets?(?:ed)?|skyrocket\w*)\s+(?:straight\s+)?up\b"
            r"|\boff\s+the\s+(?:top\s+of\s+the\s+)?(?:chart|charts|scale|graph)\b"
            r"|\bhockey[\s-]?stick\b|\bstraight\s+up\b|\by[\s-]?axis\s+(?:auto[\s-]?)?rescal\w*",
            re.IGNORECASE,
        ),
    ),
    (
        # A size far past any usual one, said in words ("sits in the thousands, sometimes tens
        # of thousands", "the gradients are massive").
        "huge",
        _regex.compile(
            r"(?<!not\s)(?<!n't\s)(?<!never\s)(?<!that\s)"
            r"(?:\bin\s+the\s+(?:(?:tens|hundreds)\s+of\s+)?(?:thousands|millions)\b"
            r"|\b(?:tens|hundreds)\s+of\s+thousands\b"
            r"|\b(?:massive|huge|enormous|gigantic|astronomical|sky[\s-]?high)\b)",
            re.IGNORECASE,
        ),
    ),
    (
        # Nothing drawn any more: the value is NaN/Inf (dashboards drop non-finite points).
        "blank",
        _regex.compile(
            r"\b(?:goes|went|turns?|is|became|becomes)\s+(?:completely\s+)?(?:blank|empty)\b"
            r"|\bstops?\s+(?:drawing|plotting|showing)\b|\bstopped\s+(?:drawing|plotting|showing)\b"
            r"|\b(?:the\s+)?line\s+(?:just\s+)?(?:ends|stops|disappears)\b"
            r"|\b(?:disappears?|vanish(?:es)?)\s+(?:off|from)\s+the\s+(?:chart|graph|plot|panel)\b"
            r"|\bno\s+(?:more\s+)?(?:points|data\s+points)\b|\bjust\s+(?:has\s+)?a\s+gap\b",
            re.IGNORECASE,
        ),
    ),
    (
        # A flat line at zero.
        "zero",
        _regex.compile(
            r"\bpinned\s+to\s+the\s+x[\s-]?axis\b"
            r"|\b(?:dead[\s-]?)?flat\s+(?:line\s+)?(?:at\s+|on\s+)?(?:0(?:\.0+)?|zero)\b(?!\.\d)"
            r"|\b(?:a\s+)?(?:dead[\s-]?flat|flat)\s+0(?:\.0+)?\b(?!\.\d)"
            # "has been 0.0 for the whole run", "stays at 0 for the whole run".
            r"|\b(?:stays?|stayed|sits?|sat|has\s+been|remains?|remained)\s+(?:at\s+)?"
            r"(?:0(?:\.0+)?|zero)\s+(?:for|through(?:out)?|during|over|across|the\s+whole|all)\b",
            re.IGNORECASE,
        ),
    ),
    (
        # A flat line at one exact non-zero value: something holds it there.
        "pinned",
        _regex.compile(
            r"\b(?:never\s+(?:budges|moves|changes)\s+from|(?:perfectly|ruler[\s-]?straight|"
            r"dead)[\s-]+(?:flat|horizontal)\s+(?:line\s+)?(?:at|on)|(?:flat|horizontal)\s+line\s+"
            r"at\s+exactly|(?:sits?|stuck|pinned)\s+(?:at\s+)?exactly)\s+(?!0(?:\.0+)?(?![\d.]))"
            + _NUMBER
            + r"|\bnot\s+a\s+(?:single\s+)?(?:hair|wiggle|blip)\b",
            re.IGNORECASE,
        ),
    ),
    (
        "ramp_up",
        _regex.compile(
            r"\b(?:drifts?|drifting|creeps?|creeping|ramps?|ramping|trends?|trending)\s+"
            r"(?:steadily\s+)?(?:up|upwards?|higher)\b|\bslow\s+ramp\b"
            r"|\b(?:like|as)\s+a\s+(?:slow\s+|steady\s+|gentle\s+)?ramp\b"
            r"|\b(?:going|goes|gone|went)\s+up\s+(?:slowly|steadily|gradually)\b"
            r"|\b(?:slow|steady|gradual)\s+climb\b|\bclimbs?\s+(?:slowly|steadily|gradually)\b"
            r"|\bdoubl\w+\s+every\b",
            re.IGNORECASE,
        ),
    ),
    (
        "slide_down",
        _regex.compile(
            r"\b(?:slides?|sliding|sinks?|sinking|fades?|fading|dwindl\w+|decays?|decaying)\s+"
            r"(?:steadily\s+|slowly\s+)?(?:towards?|to|down\s+to|into)\s+(?:the\s+)?"
            r"(?:floor|zero|bottom|nothing)\b|\bhugging\s+zero\b",
            re.IGNORECASE,
        ),
    ),
    (
        "staircase_down",
        _regex.compile(
            r"\b(?:stepping|steps?|stairs?)\s+down\b|\bstair[\s-]?case\b"
            r"|\bkeeps?\s+halving\b|\bhalv(?:es|ing)\s+(?:again\s+)?and\s+again\b",
            re.IGNORECASE,
        ),
    ),
    (
        # Leaves its level and comes back: a heartbeat, a dip once in a while.
        "occasional_dip",
        _regex.compile(
            r"\bonce\s+in\s+a\s+(?:blue\s+moon|while)\b|\bheart[\s-]?beat\b"
            r"|\b(?:dips?|drops?)\s+(?:to\s+" + _NUMBER + r"\s+)?(?:now\s+and\s+then|occasionally|"
            r"every\s+(?:so\s+often|now\s+and\s+then)|rarely)\b"
            r"|\b(?:ticks?\s+up|fires?|engages?|kicks?\s+in)\s+(?:maybe\s+|only\s+|about\s+|~\s*)?"
            r"\d+\s+times?\s+(?:per|every|in)\b"
            r"|\b(?:engages?|fires?|kicks?\s+in|triggers?|is\s+active)\s+on\s+(?:only\s+|about\s+|"
            r"~\s*)?\d(?:\.\d+)?\s*%\s+of\s+(?:the\s+)?steps\b"
            r"|\bgoes\s+back\s+and\s+forth\s+between\b",
            re.IGNORECASE,
        ),
    ),
    (
        # Good for a while, then turns and climbs back.
        "turns_up",
        _regex.compile(
            r"\bturns?\s+around\s+and\s+(?:climbs?|goes|heads?|creeps?)\s+(?:back\s+)?up\b"
            r"|\bclimbs?\s+back\s+up\s+to\s+where\s+it\s+started\b",
            re.IGNORECASE,
        ),
    ),
)

#: Lower-case words one of which every match of a trend holds (a cheap test before its regex).
_TREND_CUES: dict[str, tuple[str, ...]] = {
    "needle": ("needle", "weed", "spike", "single", "back"),
    "sawtooth": ("saw", "teeth", "zig"),
    "vertical": ("vertical", "roof", "shoot", "shot", "rocket", "off the", "hockey", "up", "axis"),
    "huge": ("thousand", "million", "massive", "huge", "enormous", "gigantic", "astronom", "sky"),
    "blank": ("blank", "empty", "stop", "line", "disappear", "vanish", "no more", "no ", "gap"),
    "zero": ("axis", "flat", "0", "zero"),
    "pinned": ("never", "flat", "horizontal", "exactly", "hair", "wiggle", "blip"),
    "ramp_up": ("drift", "creep", "ramp", "trend", "doubl", "up", "climb"),
    "slide_down": ("slid", "sink", "fad", "dwindl", "decay", "hugging"),
    "staircase_down": ("step", "stair", "halv"),
    "occasional_dip": (
        "once in",
        "heart",
        "dip",
        "drop",
        "tick",
        "fire",
        "engage",
        "kick",
        "trigger",
        "active",
        "back and forth",
    ),
    "turns_up": ("turn", "climb"),
}

#: What a frame's quantity doing its trend means: (quantity, trend) → (entry id, strength).
_FRAME_ENTRIES: dict[tuple[str, str], tuple[str, float]] = {
    ("grad_norm", "vertical"): ("exploding-gradients", 0.75),
    # The clipping counter at zero all run: the limit is above every norm, clipping never acts.
    ("clip_rate", "zero"): ("clip-never-active", 0.9),
    ("grad_norm", "huge"): ("exploding-gradients", 0.75),
    ("grad_norm", "needle"): ("grad-norm-spikes", 0.8),
    ("grad_norm", "pinned"): ("clipping-slow-convergence", 0.8),
    ("grad_norm", "zero"): ("zero-gradients", 0.6),
    ("grad_norm", "ramp_up"): ("grad-norm-rising", 0.8),
    ("grad_norm", "slide_down"): ("grad-norm-decaying", 0.8),
    ("loss", "blank"): ("loss-nan", 0.8),
    ("loss", "vertical"): ("loss-diverging", 0.6),
    ("loss", "sawtooth"): ("loss-spikes", 0.8),
    ("loss", "needle"): ("loss-spikes", 0.6),
    ("loss", "turns_up"): ("diverges-after-stable-start", 0.7),
    ("loss_scale", "staircase_down"): ("amp-overflow-skips", 0.8),
}


@dataclass(frozen=True)
class Frame:
    """One statement read as "quantity does trend", with where the trend was said."""

    quantity: str
    trend: str
    start: int
    words: str


#: Sentence ends (a point between digits is a decimal point, not an end).
_SENTENCE_END = _regex.compile(r"(?<!\d)[.!?](?!\d)|[;\n]")

#: The run goes on improving: frames that would call an alarm are then read as healthy.
_LOSS_FALLING = _regex.compile(
    r"\bloss(?:es)?\b(?:(?!\bnot\b|n't\b|\bstop)[^.;\n]){0,30}?\b(?:(?:sliding|going|falling|"
    r"coming|trending|goes|keeps?\s+going)\s+down|dropping|decreasing|improving)\b",
    re.IGNORECASE,
)
#: A stable start told right before what the loss does next.
_STABLE_BEFORE = _regex.compile(
    r"\b(?:fine|perfect\w*|good|great|stable|stably|smooth\w*|normal\w*|healthy|beautiful\w*|"
    r"nicely)\b[^.;\n]{0,60}\b(?:then|until|but|suddenly|abruptly)\b[^.;\n]*$",
    re.IGNORECASE,
)
#: The gradient norm sits well under the clipping limit outside the rare clipped steps.
_UNDER_LIMIT = _regex.compile(
    r"\b(?:well\s+)?(?:under|below)\s+the\s+(?:limit|max_norm|threshold)\b"
)
#: A measuring hook that runs once the step (and so zero_grad) is done.
_AFTER_STEP_HOOK = _regex.compile(
    r"\b(?:callback|hook)\b[^.;\n]{0,40}\b(?:after|once)\b[^.;\n]{0,20}\bstep\b[^.;\n]{0,15}"
    r"\b(?:finish\w*|done|complete\w*|ends?)\b|on_train_batch_end|on_after_optimizer_step",
    re.IGNORECASE,
)
_STILL_LEARNING = _regex.compile(
    r"\b(?:acc(?:uracy)?|score|f1|bleu)\b[^.;\n]{0,25}\b(?:climbs?|rises?|goes\s+up|improv\w+|"
    r"keeps?\s+(?:going\s+up|improving))\b|\bobviously\s+(?:trains|learns)\b",
    re.IGNORECASE,
)


def _quantities_in(sentence: str, offset: int) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    covered = bytearray(len(sentence) + 1)
    for name, pattern in _QUANTITIES:
        for m in pattern.finditer(sentence):
            if covered[m.start()]:
                continue
            if name == "loss" and _HELD_OUT_BEFORE.search(
                sentence, max(0, m.start() - 24), m.start()
            ):
                continue
            covered[m.start() : m.end()] = b"\x01" * (m.end() - m.start())
            found.append((offset + m.start(), name))
    return sorted(found)


def read_frames(text: str) -> list[Frame]:
    """Every "quantity does trend" statement in ``text``, in the order they are said."""
    frames: list[Frame] = []
    subject: str | None = None
    start = 0
    lowered = text.lower()
    active = [
        (trend, pattern)
        for trend, pattern in _TRENDS
        if any(cue in lowered for cue in _TREND_CUES[trend])
    ]
    if not active:
        return frames
    bounds = [m.end() for m in _SENTENCE_END.finditer(text)] + [len(text)]
    for end in bounds:
        sentence = text[start:end]
        if sentence.strip():
            mentions = _quantities_in(sentence, start)
            taken = bytearray(len(sentence) + 1)
            trends: list[tuple[int, str, str]] = []
            for trend, pattern in active:
                for m in pattern.finditer(sentence):
                    if taken[m.start()]:
                        continue
                    taken[m.start() : m.end()] = b"\x01" * (m.end() - m.start())
                    trends.append((start + m.start(), trend, m.group(0)))
            positions = [pos for pos, _ in mentions]
            for at, trend, words in sorted(trends):
                i = bisect_left(positions, at)
                if i > 0:
                    quantity: str | None = mentions[i - 1][1]
                elif subject is not None:
                    quantity = subject
                elif trend != "huge":
                    quantity = mentions[i][1] if i < len(mentions) else None
                else:
                    # "my huge model's grad norm is fine": a size word before the quantity
                    # describes something else.
                    quantity = None
                if quantity is not None and not any(
                    (f.quantity, f.trend) == (quantity, trend) for f in frames
                ):
                    frames.append(Frame(quantity, trend, at, words))
            if mentions:
                subject = mentions[-1][1]
        start = end
    return frames


#: Entries about what the loss does, and about what the gradient norm does: a trend word the
#: frames give to one quantity is no evidence for the other's entries.
LOSS_TREND_ENTRIES = frozenset(
    {"plateau", "loss-stuck", "loss-spikes", "loss-diverging", "diverges-after-stable-start"}
)
NORM_TREND_ENTRIES = frozenset(
    {"grad-norm-spikes", "grad-norm-rising", "grad-norm-decaying", "exploding-gradients"}
)
#: A quantity read as healthy rules out the entries that say it misbehaves.
_HEALTHY_RULES_OUT: dict[str, frozenset[str]] = {
    "clip_rate": frozenset({"clip-too-aggressive", "clip-harder", "clipping-slow-convergence"}),
    "loss_scale": frozenset({"amp-overflow-skips", "amp-diverges"}),
}


@dataclass
class FrameEvidence:
    """What the frames of one text add to the ranking."""

    hits: list[CodeHit]
    #: The quantities some trend was said about.
    quantities: frozenset[str]
    #: Entries a healthy reading contradicts.
    ruled_out: frozenset[str]
    #: Entries of the stages a NaN hunt checked and found finite.
    cleared: frozenset[str] = frozenset()
    #: The entry of the first stage a NaN hunt found non-finite, when the text locates it.
    located: str | None = None

    def discounted(self) -> frozenset[str]:
        """Entries whose trend words the frames gave to another quantity.

        (Entries a healthy frame contradicts are ``ruled_out``, weighed with the numbers the
        text gives inside their band.)
        """
        out: set[str] = set()
        if "loss" not in self.quantities and self.quantities & {"grad_norm", "loss_scale"}:
            out |= LOSS_TREND_ENTRIES
        if "grad_norm" not in self.quantities and "loss" in self.quantities:
            out |= NORM_TREND_ENTRIES
        return frozenset(out - {h.entry_id for h in self.hits})


def frame_evidence(text: str, code: str = "", full_text: str | None = None) -> FrameEvidence:
    """Catalogue evidence from the frames of ``text`` (its prose).

    ``code`` only tells where a hook runs; ``full_text`` (the prose with its inline code, where
    a NaN hunt's checks are told: ``if torch.isnan(loss): breakpoint()``) is read for the stage
    a NaN was located in.
    """
    frames = read_frames(text)
    hits = frame_hits(text, code, frames)
    checks = text if full_text is None else full_text
    # Every non-finite reading holds one of these words; a finite one matters only next to it.
    lowered = checks.lower()
    states = _stage_states(checks) if any(cue in lowered for cue in _STATE_CUES) else {}
    located = located_nan(checks, states)
    checked = checked_stage(checks) if any(cue in lowered for cue in _CHECK_CUES) else None
    if checked is not None:
        # An explicit check's verdict outranks the stage read from the words around it.
        located = checked
    if located is not None:
        hits.append(located)
    ruled_out: set[str] = set()
    settled = scaler_settles(text)
    if settled is not None:
        hits = [h for h in hits if h.entry_id not in _HEALTHY_RULES_OUT["loss_scale"]]
        hits.append(settled)
        ruled_out |= _HEALTHY_RULES_OUT["loss_scale"]
    noisy = noisy_loss_improving(text)
    if noisy is not None:
        hits = [h for h in hits if h.entry_id not in noisy[1]]
        hits.append(noisy[0])
        ruled_out |= noisy[1]
    for hit in hits:
        if hit.entry_id == "healthy":
            quantity = hit.reason.split("'", 1)[0].removeprefix("text: the ").strip()
            ruled_out |= _HEALTHY_RULES_OUT.get(quantity.replace(" ", "_"), frozenset())
    return FrameEvidence(
        hits,
        frozenset(f.quantity for f in frames),
        frozenset(ruled_out),
        cleared_stages(checks, states),
        located.entry_id if located is not None else None,
    )


def frame_hits(text: str, code: str = "", frames: list[Frame] | None = None) -> list[CodeHit]:
    """Catalogue evidence from the frames of ``text``; the earliest cause is the surest."""
    frames = read_frames(text) if frames is None else frames
    if not frames:
        return []
    hits: list[CodeHit] = []
    loss_falling = bool(_LOSS_FALLING.search(text))
    seen: set[str] = set()
    for order, frame in enumerate(frames):
        entry, strength = _FRAME_ENTRIES.get((frame.quantity, frame.trend), ("", 0.0))
        if frame.quantity in ("loss_scale", "clip_rate") and frame.trend == "occasional_dip":
            if loss_falling or _UNDER_LIMIT.search(text):
                # The scale backs off once in a while and recovers, or clipping catches a few
                # rare steps, while the loss falls: the mechanism doing its job.
                entry, strength = "healthy", 0.7
        elif (
            frame.quantity == "grad_norm"
            and frame.trend == "zero"
            and (
                _AFTER_STEP_HOOK.search(text)
                or _AFTER_STEP_HOOK.search(code)
                or _STILL_LEARNING.search(text)
            )
        ):
            # A gradient norm of exactly zero all along while the model learns: the number is
            # read where the gradients were already zeroed.
            entry, strength = "monitor-after-zero-grad", 0.85
        elif (
            frame.quantity == "loss"
            and entry == "loss-diverging"
            and _STABLE_BEFORE.search(text, max(0, frame.start - 120), frame.start)
        ):
            # "trains beautifully for 6 epochs, then the loss shoots up": a divergence after a
            # stable start, told in the one sentence.
            entry, strength = "diverges-after-stable-start", 0.7
        if not entry or entry in seen or strength <= 0.0:
            continue
        seen.add(entry)
        # Later frames are what the first one leads to ("... then the loss chart is blank").
        strength = strength if order == 0 else strength * 0.85
        hits.append(
            CodeHit(
                entry,
                round(strength, 3),
                f"text: the {frame.quantity.replace('_', ' ')} {frame.words!r}",
            )
        )
    return hits


# -- where a NaN hunt found the first non-finite value ---------------------------------------

#: The stages a value passes through in one training step, in order, and the entry that says
#: the NaN begins there. A check that finds a stage finite and a later one non-finite has
#: located the cause: the first non-finite stage.
_STAGES: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    (
        "inputs",
        "nonfinite-inputs",
        _regex.compile(r"\b(?:inputs?|batch(?:es)?|features?|images?|samples?)\b", re.IGNORECASE),
    ),
    (
        "parameters",
        "nan-parameters",
        _regex.compile(
            # Not the parameter a gradient belongs to ("q_proj.weight grad amax inf", "gradients
            # from `parameters`").
            r"(?<!from\s)(?<!from\s`)\b(?:weights?|params?|parameters?|state_dict|"
            r"checkpoint\s+tensors?)\b(?!\s*\.?\s*grad)",
            re.IGNORECASE,
        ),
    ),
    (
        "outputs",
        "nan-loss-before-backward",
        # Not a backward function's "0th output" (anomaly mode: that output is a gradient).
        _regex.compile(
            r"(?<!\dth\s)(?<!\dst\s)(?<!\dnd\s)(?<!\drd\s)"
            r"\b(?:logits|outputs?|predictions?|activations?)\b",
            re.IGNORECASE,
        ),
    ),
    (
        "loss",
        "nan-loss-before-backward",
        _regex.compile(r"\b(?:loss|criterion)\b(?!\s*\.\s*backward)(?!\s+scal)", re.IGNORECASE),
    ),
    (
        "gradients",
        "nan-gradients",
        _regex.compile(r"\.grad\b|\bgrads?\b|\bgradients?\b", re.IGNORECASE),
    ),
)
#: A check's verdict after its name: "parameters finite ....... FAIL", "isfinite(x): False".
_FAILED = r"[\s.:=?()\]]*(?:fail(?:ed|s)?|false|no)\b"
_PASSED = r"[\s.:=?()\]]*(?:ok|okay|pass(?:ed|es)?|true|yes)\b"
_NON_FINITE = _regex.compile(
    r"\b(?:nan|inf|non-?finite)s?\b(?!\s*(?:check|guard))|\bfull\s+of\s+nan"
    r"|\b(?:trips|tripped|fires|fired)\b|\bstops\s+there\b"
    rf"|\b(?:is)?finite\b(?:\([^()\n]*(?:\([^()\n]*\))?[^()\n]*\))?(?:\.all\(\))?{_FAILED}"
    rf"|\bis(?:nan|inf)\b(?:\([^()\n]*(?:\([^()\n]*\))?[^()\n]*\))?(?:\.any\(\))?{_PASSED}",
    re.IGNORECASE,
)
_FINITE = _regex.compile(
    r"\b(?:all\s+|still\s+|perfectly\s+|totally\s+)?(?<!-)(?<!non)(?:finite|normal|clean)\b"
    rf"(?!\s+check)(?!{_FAILED})"
    # "no nan/inf", "0 NaN/Inf", "nan 0 | inf 0", "nothing is non-finite": a count of zero.
    r"|\b(?:no|zero|0)\s+(?:nans?|infs?)(?:\s*(?:/|or|and|,|nor)\s*(?:nans?|infs?))*\b"
    r"|\bnot\s+(?:a\s+)?nans?\b"
    r"|\b(?:nans?|infs?)(?:\s*/\s*(?:nans?|infs?))?[^\S\n]*[:=]?[^\S\n]*0\b(?![.,]\d)"
    r"|\bnothing\s+(?:is\s+|was\s+|went\s+)?(?:non-?finite|nan|inf)\b"
    r"|\blooked\s+fine\b|\bwere\s+fine\b"
    r"|\b(?:totally|perfectly|completely|looks?|looked|seems?|seemed|printed|prints|is|was|"
    r"reads?)\s+fine\b"
    rf"|\bis(?:nan|inf)\b(?:\([^()\n]*(?:\([^()\n]*\))?[^()\n]*\))?(?:\.any\(\))?{_FAILED}",
    re.IGNORECASE,
)
#: A clause that sets the stage it names against another ("every other layer's grad looks
#: normal"): its finite state leaves the non-finite one standing.
_CONTRAST = _regex.compile(
    r"\b(?:every|all|any)\s+other\b|\bthe\s+(?:other|rest)\b|\beverything\s+else\b|\bothers\b",
    re.IGNORECASE,
)
#: "no nan" next to an inf: the text tells which non-finite value it is, not that all is finite.
_NO_NAN = _regex.compile(r"\bno\s+nans?\b|\bnot\s+(?:a\s+)?nans?\b", re.IGNORECASE)
#: A NaN the text says is absent ("not nan", "no nan anywhere", "isnan(...) False").
_NAN_DENIED = _regex.compile(
    r"\b(?:not|no|never|zero|without)\s+(?:a\s+|any\s+)?nans?\b"
    r"|\bnans?\s*(?:[:=]\s*)?(?:0|false|none)\b"
    rf"|\bisnan\b(?:\([^()\n]*(?:\([^()\n]*\))?[^()\n]*\))?(?:\.any\(\))?{_FAILED}",
    re.IGNORECASE,
)
#: A loss printed as a plain number: finite, a weaker word than "finite" itself.
_LOSS_NUMBER = _regex.compile(
    r"\bloss\w*\b(?:[^\S\n]*[:=]?[^\S\n]*|[^\n.;,]{0,20}?)(?<![\w.])\d+\.\d+\b", re.IGNORECASE
)
#: A row of a per-parameter table: a dotted parameter name, then its value.
_PARAM_ROW = _regex.compile(
    r"^[^\S\n]*[A-Za-z_][\w.*\[\]-]*\.(?:weight|bias|\*|w\d*|b)\b[^\n]*$", re.MULTILINE
)
_GRADIENT_WORD = _regex.compile(r"\bgrad\w*|\.grad\b", re.IGNORECASE)


def _gradient_tables(text: str) -> list[tuple[int, int]]:
    """Rows of per-parameter tables whose values are gradients.

    The rows name parameters ("encoder.0.ffn.w1   inf") but the lines just above them say
    what the values are ("per-param grad norms at step 3307:", "grad scan ... walking
    named_parameters:"): a gradient word there makes the rows' values gradients.
    """
    regions: list[tuple[int, int]] = []
    rows = list(_PARAM_ROW.finditer(text))
    index = 0
    while index < len(rows):
        first = rows[index]
        last = first
        while index + 1 < len(rows) and rows[index + 1].start() <= last.end() + 1 + 200:
            between = text[last.end() : rows[index + 1].start()]
            if between.count("\n") > 2:
                break
            index += 1
            last = rows[index]
        index += 1
        above = text[: first.start()].rstrip("\n").split("\n")[-2:]
        if _GRADIENT_WORD.search(" ".join(above)):
            regions.append((first.start(), last.end()))
    return regions


#: Words one of which every explicit check holds.
_CHECK_CUES = ("isfinite", "isnan", "isinf", "first non", "first nan", "first inf", "whose")
#: Words one of which every non-finite state holds (a cheap test before the regexes).
_STATE_CUES = ("nan", "inf", "finite", "fail", "false", "trip", "fire", "stops there")
_SENTENCE_STOP = _regex.compile(r"[.!?](?=\s)|[;\n]")
_BEFORE_BACKWARD = _regex.compile(
    r"\bbefore\s+(?:the\s+|calling\s+|any\s+|it\s+\w+\s+|we\s+\w+\s+|i\s+\w+\s+)?"
    r"(?:\w+)?\.?\s*backward\b|\b(?:right\s+|just\s+|directly\s+)?after\s+the\s+forward\b"
    r"|\bskipped\s+(?:the\s+)?backward\b|\bbackward\b[^.\n]{0,30}\bnot\s+reached\b"
    r"|\bbetween\b[^.\n]{0,40}\band\s+(?:the\s+)?(?:\w+\.)?backward\b",
    re.I,
)
#: A state said after its stage counts as far as one said this much closer before it ("the loss
#: ... was 3.87, a totally normal number" vs "reports nan inside layer.grad").
_FOLLOWING_PENALTY = 2.0
_POINTS_AHEAD = _regex.compile(r"\s+(?:in|inside|within|anywhere\s+in|at)\b", re.IGNORECASE)
_INF_ONLY = _regex.compile(r"\binf(?:s|inity|inite)?\b", re.IGNORECASE)


def _stage_states(text: str) -> dict[str, list[str]]:
    """Each stage the text says is non-finite ("bad") or finite ("good"), in the text's order.

    A state word belongs to the nearest stage named in its sentence, a preceding one preferred.
    A loss printed as a plain number is finite too, said more weakly ("num"). A finite word in
    a clause about the other members of a stage ("every other layer's grad looks normal"), and
    "no nan" in a text that names an inf, do not say the stage is finite.
    """
    said: dict[str, list[tuple[int, str]]] = {}
    start = 0
    inf_named = bool(_INF_ONLY.search(text))
    tables = _gradient_tables(text) if "." in text else []
    for end in [m.end() for m in _SENTENCE_STOP.finditer(text)] + [len(text)]:
        sentence = text[start:end]
        offset = start
        start = end
        mentions = sorted(
            (m.start(), m.end(), stage) for stage, _, p in _STAGES for m in p.finditer(sentence)
        )
        if not mentions:
            continue
        if any(a <= offset < b for a, b in tables):
            mentions = [(a, b, "gradients" if st == "parameters" else st) for a, b, st in mentions]
        starts = [m[0] for m in mentions]
        by_end = sorted((m[1], m[2]) for m in mentions)
        ends = [e for e, _ in by_end]
        good_matches = list(_FINITE.finditer(sentence))
        covered = bytearray(len(sentence) + 1)
        for m in good_matches:
            covered[m.start() : m.end()] = b"\x01" * (m.end() - m.start())
        contrast = bool(_CONTRAST.search(sentence))
        good = [
            (m.start(), m.end())
            for m in good_matches
            if not (inf_named and _NO_NAN.fullmatch(m.group(0)))
        ]
        bad = [
            (m.start(), m.end()) for m in _NON_FINITE.finditer(sentence) if not covered[m.start()]
        ]
        for state, spans in (("bad", bad), ("other" if contrast else "good", good)):
            for s, e in spans:
                # "no nan in any parameter", "nan inside layer.grad": the stage follows.
                ahead = 1 / _FOLLOWING_PENALTY if _POINTS_AHEAD.match(sentence, e) else 1.0
                candidates: list[tuple[float, str]] = []
                i = bisect_right(ends, s)
                if i > 0:
                    candidates.append((s - by_end[i - 1][0], by_end[i - 1][1]))
                j = bisect_left(starts, s)
                if j < len(mentions):
                    gap = max(0, mentions[j][0] - e) * _FOLLOWING_PENALTY * ahead
                    candidates.append((gap, mentions[j][2]))
                if candidates:
                    stage = min(candidates, key=lambda c: c[0])[1]
                    said.setdefault(stage, []).append((offset + s, state))
    if "loss" not in said or all(state == "good" for _, state in said["loss"]):
        for m in _LOSS_NUMBER.finditer(text):
            said.setdefault("loss", []).append((m.start(), "num"))
    states = {stage: [state for _, state in sorted(told)] for stage, told in said.items()}
    for stage, told in states.items():
        # The other members finite next to one that is not: the stage is not finite.
        states[stage] = [
            "good" if state == "other" else state
            for state in told
            if state != "other" or "bad" not in told
        ]
    return states


def _final(states: dict[str, list[str]], stage: str) -> str | None:
    """What the text last says about ``stage`` ("the weights were finite at 7339 ... 12 NaN
    entries at 7340": bad), a plain loss number only when nothing else is said."""
    told = states.get(stage, [])
    words = [state for state in told if state != "num"]
    return words[-1] if words else ("num" if told else None)


def cleared_stages(text: str, states: dict[str, list[str]] | None = None) -> frozenset[str]:
    """Entries of the stages the text checked and found finite (and never non-finite)."""
    if states is None:
        if not _FINITE.search(text):
            return frozenset()
        states = _stage_states(text)
    bad = {e for s, e, _ in _STAGES if "bad" in states.get(s, ())}
    return frozenset(
        e
        for s, e, _ in _STAGES
        if "good" in states.get(s, ()) and "bad" not in states.get(s, ()) and e not in bad
    )


#: A check said to have run on the inputs ("torch.isfinite(batch[...]).all(): False").
_INPUT_CHECK = _regex.compile(
    r"\bis(?:nan|inf|finite)\s*\(\s*(?:\w+\.)?(?:batch|inputs?|input_\w+|x|xb|images?|"
    r"features?|samples?|data)\b|\b\d+\s+(?:of|/)\s+\d+\s+(?:values?|elements?|entries)\s+(?:are\s+)?nan"
    # A check placed before the forward pass is a check on what goes in: "an isnan check on
    # the tensor right before model(x)", "a finite assert just before the forward".
    r"|\b(?:is(?:nan|inf|finite)|nan|inf|finite)\w*\s+(?:check|guard|assert\w*)\b[^.\n]{0,40}?"
    r"\bbefore\s+(?:the\s+|calling\s+(?:the\s+)?)?(?:forward\b|model\s*\(|net\s*\()",
    re.IGNORECASE,
)


#: The values told are of one step ("the loss for that step was 2.02").
_SAME_STEP = _regex.compile(
    r"\b(?:that|the\s+same|this|the\s+failing|the\s+bad|each\s+such)\s+(?:step|iteration|iter|batch)\b",
    re.IGNORECASE,
)


def located_nan(text: str, states: dict[str, list[str]] | None = None) -> CodeHit | None:
    """The entry for the first stage a NaN hunt found non-finite, when the text locates it."""
    if states is None:
        if not _NON_FINITE.search(text):
            return None
        states = _stage_states(text)
    order = [stage for stage, _, _ in _STAGES]
    final = {stage: _final(states, stage) for stage in order}
    bad = [s for s in order if final[s] == "bad"]
    if not bad:
        return None
    first = bad[0]
    # A loss printed as a number counts as a finite stage only in a hunt that checks stages.
    checked = any("good" in told for told in states.values()) or bool(_SAME_STEP.search(text))
    finite = ("good", "num") if checked else ("good",)
    earlier_good = any(final[s] in finite for s in order[: order.index(first)])
    later_bad = len(bad) > 1
    if first in ("outputs", "loss"):
        # The loss already non-finite before backward runs: located in the forward pass.
        if not _BEFORE_BACKWARD.search(text):
            return None
    elif first == "inputs":
        # "batch" is also a step counter ("nan at batch 3412"): only a check on the inputs.
        if not _INPUT_CHECK.search(text):
            return None
    elif not (earlier_good or (first == "parameters" and later_bad)):
        return None
    entry = next(e for s, e, _ in _STAGES if s == first)
    if first == "gradients" and _INF_ONLY.search(text) and not _nan_told(text):
        entry = "inf-gradients"
    return CodeHit(entry, 0.8, f"text: the first stage checked and found non-finite is the {first}")


def _nan_told(text: str) -> bool:
    """Whether the text names a NaN it does not deny ("not nan, literally infinity": no)."""
    denied = [m.span() for m in _NAN_DENIED.finditer(text)]
    return any(
        not any(s <= m.start() < e for s, e in denied)
        for m in re.finditer(r"\bnan", text, re.IGNORECASE)
    )


# -- per-layer gradient norms told side by side ------------------------------------------------

_LAYER_WORD = (
    r"\b(?:[a-z_]\w*\.)*(?:stem|conv|stage|block|layers?|fc|linear|embed\w*|head|"
    r"lm_head|encoder|decoder|lstm|gru|mlp|attn|classifier|input|output)\w*(?:\.\w+)*"
)
_LAYER_NAME = _regex.compile(_LAYER_WORD, re.IGNORECASE)
_LAYER_VALUE = _regex.compile(
    r"(?P<layer>" + _LAYER_WORD + r")"
    r"(?:[^\d\n.;]|\.(?!\s)){0,40}?(?<![\w.])(?P<value>\d+(?:\.\d+)?(?:e[-+]?\d+)?)(?![\w%])(?!\.\d)",
    re.IGNORECASE,
)
_LATE_FIRST = _regex.compile(r"^(?:output|head|lm_head|classifier|fc|decoder)", re.IGNORECASE)
_PROFILE_STOP = _regex.compile(r"(?<!\d)[.!?;](?!\d)|\n")
_WORRY = _regex.compile(r"vanish|not\s+learning|isn't\s+learning|smallest|tiny|invisible", re.I)


def layer_profile_hits(text: str, early_late_ratio: float, improving: bool) -> list[CodeHit]:
    """Gradient norms given layer by layer in one line or sentence, read from input to output.

    The last layer's norm over the first one's above ``early_late_ratio`` (the profile's
    threshold) while training does not improve is vanishing gradients; a profile within a
    hundredfold while training improves answers a worry about a small early layer: healthy.
    """
    if not re.search(r"grad|bars?\b", text, re.IGNORECASE):
        return []
    hits: list[CodeHit] = []
    start = 0
    for end in [m.start() for m in _PROFILE_STOP.finditer(text)] + [len(text)]:
        part = text[start:end]
        start = end + 1
        pairs: list[tuple[str, float]] = []
        for m in _LAYER_VALUE.finditer(part):
            # The layer named last before the value ("per block: embed 2e-11" is the embed's).
            named = _LAYER_NAME.findall(part, m.start(), m.start("value"))
            name = (named[-1] if named else m.group("layer")).lower()
            if any(name == seen for seen, _ in pairs):
                continue
            try:
                value = float(m.group("value"))
            except ValueError:
                continue
            if value > 0:
                pairs.append((name, value))
        if len(pairs) < 2:
            continue
        first, last = pairs[0], pairs[-1]
        if _LATE_FIRST.match(first[0].rsplit(".", 1)[-1]) and not _LATE_FIRST.match(
            last[0].rsplit(".", 1)[-1]
        ):
            first, last = last, first
        ratio = last[1] / first[1]
        shown = f"{first[0]} {first[1]:g} vs {last[0]} {last[1]:g}"
        if ratio > early_late_ratio and not improving:
            hits.append(
                CodeHit("vanishing-gradients", 0.9, f"per-layer norms {shown}: early ≪ late")
            )
        elif 0.01 <= ratio <= 100 and improving and _WORRY.search(text):
            hits.append(
                CodeHit(
                    "healthy",
                    0.75,
                    f"per-layer norms {shown} within 100× while training improves",
                )
            )
        if hits:
            break
    return hits


# -- a GradScaler that backs off at the start and then settles --------------------------------

_SCALER_TOPIC = _regex.compile(
    r"\b(?:loss[\s_-]?scal(?:e|er|ing)|grad[\s_]?scaler|scaler|get_scale)\b"
    r"|\bskipp\w*\s+(?:the\s+)?(?:optimizer\s+)?steps?\b|\b(?:gradient\s+)?overflow\b",
    re.IGNORECASE,
)
#: The opening steps of a run, in the words and numbers people use for them.
_EARLY = _regex.compile(
    r"\b(?:first|opening|initial|early|starting)\s+(?:~\s*|few\s+|couple\s+(?:of\s+)?|dozen\s+|"
    r"handful\s+(?:of\s+)?|\d+\s+|\w+\s+){0,3}(?:steps?|iterations?|iters?|updates?|lines|batches|"
    r"hundred\s+steps)\b|\bat\s+the\s+(?:very\s+)?(?:start|beginning)\b|\bearly\s+(?:on|skips?|"
    r"drops?|overflows?)\b|\bat\s+step\s+[1-9]\d?\b|\bskipped\s+steps\s+at\s+[1-9]\d?\b",
    re.IGNORECASE,
)
#: After the opening back-off the scale holds, grows back, or nothing is skipped any more.
_SETTLES = _regex.compile(
    r"\b(?:then|after\s+that|since\s+then|afterwards|from\s+then\s+on)\b[^.;\n]{0,80}?"
    r"(?:\b(?:sits?|sat|stays?|stayed|holds?|held|stable|stabili[sz]\w*|settles?|settled|flat|"
    r"grows?\s+back|grew\s+back|climbs?\s+back|climbed\s+back|(?:goes|went|comes|came)\s+back\s+up|"
    r"recover\w*|nothing|no\s+(?:more\s+)?(?:skips?|overflows?))\b|\bbetween\b)"
    r"|\bnever\s+again\b|\bno\s+(?:more\s+)?(?:skips?|skipped\s+steps|overflows?)\s+(?:after|since|"
    r"for)\b|\b(?:grows?|grew|climbs?|climbed|goes|went)\s+back\s+(?:up\s+)?to\b",
    re.IGNORECASE,
)
#: Training goes well meanwhile: the loss falls, or results match full precision.
_GOES_WELL = _regex.compile(
    r"\bloss(?:es)?\b(?:[^.;\n]|\.(?=\d)){0,40}?(?:->|→|\bgoing\s+down|\bgoes\s+down|\bfall(?:s|ing)?\b|"
    r"\bdecreas\w+|\bdown\s+normally|\bsmooth\w*|\bdrops?\b|\bdropping\b|\bimprov\w+)"
    r"|\b(?:matches|match|tracks|track|same\s+as|like)\s+(?:the\s+|my\s+|our\s+)?(?:fp32|"
    r"full[\s-]precision|bf16)\b|\b(?:accuracy|acc|f1|wer|bleu|samples?)\b[^.;\n]{0,40}\b"
    r"(?:improv\w+|better|go(?:es)?\s+up|rises?|keeps?\s+improving)",
    re.IGNORECASE,
)
#: Signs the back-off was not harmless: a non-finite or diverging loss, a scale that keeps
#: falling, a precision that fails where full precision trains.
_GOES_BADLY = _regex.compile(
    r"(?<!\bno\s)(?<!\bnot\s)(?<!\bwithout\s)\bnan\b|\bdiverg\w*|\bblows?\s+up|\bblew\s+up"
    r"|\bkeeps?\s+(?:halving|dropping|falling|shrinking)\b|\b(?:collapses?|collapsed)\b"
    r"|\bunderflow\w*|\bonly\s+(?:in|with)\s+fp16\b",
    re.IGNORECASE,
)


def scaler_settles(text: str) -> CodeHit | None:
    """A loss scale that backs off in the opening steps and then holds or grows back.

    GradScaler starts high on purpose and halves on each overflowing step until it finds a
    scale that fits: a few skipped steps at the start are its calibration, not a fault. Told
    with the scale holding afterwards and training going well, that is a healthy run.
    """
    text = unwrap_prose(text)
    if not (
        _SCALER_TOPIC.search(text)
        and _EARLY.search(text)
        and _SETTLES.search(text)
        and _GOES_WELL.search(text)
    ) or _GOES_BADLY.search(text):
        return None
    return CodeHit(
        "healthy",
        1.0,
        "text: the loss scale backs off in the opening steps (GradScaler calibrating) and then "
        "holds while training goes well",
    )


# -- a noisy per-step loss whose average falls ------------------------------------------------

#: The loss said to be noisy from one batch or step to the next.
_NOISY = _regex.compile(
    r"\b(?:nois(?:e|y)|jitter\w*|bounc\w+|jumpy|wiggl\w+|fuzzy|all\s+over\s+the\s+place|"
    r"thick\s+(?:noisy\s+)?band|jumps?\s+(?:a\s+lot|around|between)|(?:step|batch)[\s-]to[\s-]"
    r"(?:step|batch)\s+(?:noise|variation|swings?))\b",
    re.IGNORECASE,
)
#: What is noisy is the raw, per-step or per-batch loss (not the gradient norm or an average).
_RAW_LOSS = _regex.compile(
    r"\b(?:per[\s-](?:batch|step|iteration)|step[\s-]level|batch[\s-]level|raw|unsmoothed|"
    r"step[\s-]to[\s-]step|batch\s+to\s+batch|between\s+batches|from\s+one\s+(?:batch|step))\b"
    r"|\bloss\s+(?:chart|curve|plot|panel|graph|line)\b|\bloss\b",
    re.IGNORECASE,
)
#: A smoothed view of the loss: a running or moving average, epoch means, the trend.
_AVERAGED = _regex.compile(
    r"\b(?:smooth(?:ed|ing)?|running\s+(?:average|mean)|moving\s+average|ema|rolling\s+(?:average|"
    r"mean|median)|\d+[\s-]*(?:step|batch|iter)\s+(?:mean|average)s?|epoch\s+(?:averages?|means?|"
    r"loss(?:es)?)|averaged?|mean\s+loss|trend(?:\s*line)?|per[\s-]epoch)\b",
    re.IGNORECASE,
)
_FALLS = _regex.compile(
    r"\b(?:goes|going|went|trends?|trending|heads?|heading|comes?|coming)\s+(?:steadily\s+|nicely\s+|"
    r"slowly\s+)?down\b|\bdecreas\w+|\bfall(?:s|ing)?\b|\bdrops?\b|\bdropping\b|\bdeclin\w+"
    r"|\bsteadily\s+(?:lower|down)\b|\bdownwards?\b|\bimprov\w+",
    re.IGNORECASE,
)
_DECIMAL = _regex.compile(r"(?<![\w.@])(\d+\.\d+)(?![\w.])")
#: Held-out results or samples that get better: learning goes on whatever the raw curve does.
_OUTCOME_IMPROVES = _regex.compile(
    r"\b(?:val(?:idation)?|eval|test|held[\s-]?out|dev)[\s_/-]*(?:acc(?:uracy)?|f1|wer|cer|bleu|"
    r"score|auc|map|metric)\b(?:[^.;\n]|\.(?=\d)){0,40}?\b(?:improv\w+|goes\s+up|went\s+up|better|"
    r"rises?|climbs?|keeps?\s+(?:going\s+up|improving))"
    r"|\b(?:samples?|images?|generations?|outputs?)\b[^.;\n]{0,60}?\b(?:better|improv\w+)"
    r"|\b(?:accuracy|f1|wer|bleu)\s+(?:improves|is\s+improving|keeps\s+improving)",
    re.IGNORECASE,
)
_NOISE_BAD = _regex.compile(
    r"(?<!\bno\s)(?<!\bnot\s)(?<!\bwithout\s)(?<!\bany\s)\bnan\b|\bdiverg\w*|\bblows?\s+up|"
    r"\bblew\s+up|\bexplod\w*|\b(?:keeps?|kept)\s+(?:climbing|rising|going\s+up)",
    re.IGNORECASE,
)


def _averaged_falls(sentence: str) -> bool:
    for m in _AVERAGED.finditer(sentence):
        after = sentence[m.end() : m.end() + 100]
        if _FALLS.search(after):
            return True
        values = [float(v) for v in _DECIMAL.findall(after)]
        if len(values) >= 3 and values[-1] < values[0] and values == sorted(values, reverse=True):
            return True
    return False


def noisy_loss_improving(text: str) -> tuple[CodeHit, frozenset[str]] | None:
    """A per-step loss said to be noisy while its average falls or held-out results improve.

    Small batches make each step's loss jump; what says whether training works is the smoothed
    curve and the held-out results. Returns the healthy reading and the entries it rules out
    (spikes and divergence; a plateau too when the held-out results improve).
    """
    text = unwrap_prose(text)
    if _NOISE_BAD.search(text):
        return None
    noisy = False
    falls = improves = False
    for sentence in _PROFILE_STOP.split(text):
        m = _NOISY.search(sentence)
        if m and _RAW_LOSS.search(sentence):
            noisy = True
        falls = falls or _averaged_falls(sentence)
        improves = improves or bool(_OUTCOME_IMPROVES.search(sentence))
    if not noisy or not (falls or improves):
        return None
    why = "its average falls" if falls else "the held-out results improve"
    ruled = {"loss-spikes", "loss-diverging"} | (set() if falls else {"plateau", "loss-stuck"})
    return (
        CodeHit("healthy", 1.0, f"text: the per-step loss is noisy but {why}: small-batch noise"),
        frozenset(ruled),
    )


# -- an explicit check on one stage and its verdict --------------------------------------------

#: ``torch.isfinite(p).all()`` / ``isinf(model.emb.weight.grad).any()`` and what follows it.
_CHECK_CALL = _regex.compile(
    r"(?P<neg>\bnot\s+)?(?:torch\.)?(?P<fn>isfinite|isnan|isinf)\s*\(\s*"
    r"(?P<arg>[^()\n]*(?:\([^()\n]*\))?[^()\n]*)\)\s*(?:\.\s*(?:any|all)\s*\(\s*\))?",
    re.IGNORECASE,
)
_VERDICT = _regex.compile(
    r"\s*[)\]]?\s*(?:(?:returns?|returned|is|was|gives|gave|comes\s+back|evaluates\s+to|==|:|->|→|=)"
    r"\s*)?(?P<v>true|false)\b",
    re.IGNORECASE,
)
#: A comprehension that lists what fails the check, then its non-empty output.
_LISTED = _regex.compile(r"\s*\]?\s*\n?[^\n]{0,12}\[\s*['\"][\w.]+['\"]")
_ARG_STAGES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("gradients", _regex.compile(r"\.grad\b|\bgrads?\b", re.IGNORECASE)),
    ("loss", _regex.compile(r"\bloss\b", re.IGNORECASE)),
    ("outputs", _regex.compile(r"\b(?:logits|outputs?|out|preds?|activations?)\b", re.IGNORECASE)),
    (
        "inputs",
        _regex.compile(
            r"\b(?:batch|inputs?|input_\w+|x|xb|images?|features?|samples?|data)\b", re.I
        ),
    ),
    ("parameters", _regex.compile(r"\b(?:p|param\w*|w|weights?|bias)\b|\.(?:weight|bias)\b", re.I)),
)
#: A gradient hook or scan that names the first parameter whose gradient is non-finite.
_GRAD_REPORT = _regex.compile(
    r"\bfirst\s+(?:non-?finite|nan|inf)\s+grad\w*"
    r"|\bfirst\s+param\w*\s+whose\s+\.?grad\w*\s+(?:is|was|goes|went|turns?)\s+(?:non-?finite|nan|inf)",
    re.IGNORECASE,
)
_LOSS_STILL_FINITE = _regex.compile(
    r"\bloss\b(?:[^.;\n]|\.(?=\d)){0,40}?\b(?:still\s+(?:finite|a\s+number)|(?<!non-)(?<!non)finite)\b",
    re.IGNORECASE,
)


def checked_stage(text: str) -> CodeHit | None:
    """The stage an explicit check found non-finite, as the entry that says the NaN starts there.

    A check call with its verdict ("torch.isinf(model.emb.weight.grad).any() returns True",
    "isfinite(batch['x']).all() is False"), a comprehension over the parameters that prints the
    names failing it, or a gradient hook naming the first non-finite gradient while the loss is
    still finite: each says which stage holds the first non-finite value, more surely than the
    words around it (the NaN loss that follows, the weights it later reaches).
    """
    found: list[tuple[int, str, bool]] = []  # (stage order, stage, inf only)
    order = [stage for stage, _, _ in _STAGES]
    for m in _CHECK_CALL.finditer(text):
        verdict = _VERDICT.match(text, m.end())
        if verdict is not None:
            true = verdict.group("v").lower() == "true"
            bad = true != (m.group("fn").lower() == "isfinite")
        elif (
            m.group("neg") and m.group("fn").lower() == "isfinite" and _LISTED.match(text, m.end())
        ):
            bad, true = True, False
        else:
            continue
        if not bad:
            continue
        stage = next((s for s, p in _ARG_STAGES if p.search(m.group("arg"))), None)
        if stage is not None:
            found.append((order.index(stage), stage, m.group("fn").lower() == "isinf" and true))
    if _GRAD_REPORT.search(text) and _LOSS_STILL_FINITE.search(text):
        found.append((order.index("gradients"), "gradients", False))
    if not found:
        return None
    _, stage, inf_only = min(found)
    entry = next(e for s, e, _ in _STAGES if s == stage)
    if stage == "gradients" and inf_only and not _nan_told(text):
        entry = "inf-gradients"
    return CodeHit(entry, 0.85, f"text: a check on the {stage} found them non-finite first")
