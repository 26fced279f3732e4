"""Free text (and pasted code) → ranked knowledge entries.

``match("my loss goes to NaN after 2k steps")`` returns the catalogue entries that fit the
text, best first, each with the reasons it was chosen. Four kinds of evidence add up:

* **words** — a BM25F ranker over each entry's fields (title, claim, paraphrases, phrasings,
  keywords, what/why/shows-up …, each with its own weight), after lower-casing, domain
  synonyms (``data/synonyms.yaml``), stemming and typo repair; adjacent word pairs count as
  phrases; the closest single title/claim/paraphrase/phrasing adds a bonus, and so does naming
  the entry ("vanishing gradients"); the form of the text (an assertion or advice versus a
  report or a question) tilts rationalizations against symptoms and red flags. Words that
  appear only in pasted code count half, and an entry about a technique the text never names
  (sigmoid stacks, mixed precision, DDP …) keeps only part of its word score.
* **numbers** — quantities read from the text (``loss: nan``, ``grad norm 3.4e+04``,
  ``dead 63%``, ``scale 65536 → 1``) compared with a threshold profile (the default one
  unless the :class:`Matcher` is built with another), and the same quantity written several
  times read as a series ("0.9 at step 1k, 4 at 10k, 25 at 30k"): a rising, decaying or spiky
  grad norm, a loss that diverges, spikes, stalls or plateaus, a norm that stays in or settles
  into the healthy range. Each reason names the threshold, its severity, the profile and the
  seed the number comes from; healthy numbers answer "is this normal?" with ``healthy`` (or
  ``small-grads-mean-broken`` when small norms come with a run that still improves).
* **code** — a fragment found in the text (fenced, indented, inline, or statements joined by
  ``;`` in a sentence) is repaired into parseable Python (a loop body without its loop,
  ``...`` pseudo-code, broken indentation) and read by the static analyser
  (``probes.static.lint_source``, imported on the first text with code), next to light order
  rules that also read fragments too broken to parse.
* **sentences** — the same mistakes stated in words ("I clip after the optimizer step",
  "no_sync only wraps the backward").

Then the ranking is settled: a red flag the text describes ranks above the symptoms and
signals it explains (the named cause first), the most serious of several mistakes in one
fragment comes first, and a serious mistake in the user's code ranks above claims the text
does not make. Learning-rate-only and data-only questions are flagged ``out_of_scope`` with a
pointer; a question that also names a gradient problem ("I lowered the LR and still get NaN")
stays in. Nothing here imports torch.
"""

from __future__ import annotations

import hashlib
import itertools
import marshal
import math
import os
import re
import sys
import threading
from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from gradient_doctor.knowledge import _regex, rerank
from gradient_doctor.knowledge._code import (
    ADVICE_FOR,
    MEASURED_CHECKS,
    SUPERSEDED_BY,
    CodeHit,
    code_hits,
    fragment_source,
    measures_grad_norm,
    prose_hits,
    split_code,
    without_code,
)
from gradient_doctor.knowledge._errors import read_errors
from gradient_doctor.knowledge._numbers import (
    Quantity,
    Series,
    fmt,
    rank_correlation,
    read_quantities,
    read_series,
)
from gradient_doctor.knowledge._text import (
    FAILURE_WORD,
    Analyzer,
    Synonyms,
    TypoCorrector,
    load_synonyms,
    negated_spans,
    normalise,
    vocabulary,
)
from gradient_doctor.knowledge.cache_dir import cache_root
from gradient_doctor.knowledge.matcher_frames import frame_evidence, layer_profile_hits

if TYPE_CHECKING:
    from gradient_doctor.knowledge.loader import KnowledgeBase
    from gradient_doctor.knowledge.models import Entry

#: ``models.EntryKind`` (a test checks they agree): importing ``models`` builds every knowledge
#: model, which a match served from the index snapshot never needs.
EntryKind = Literal["red-flag", "signal", "rationalization", "symptom"]
#: ``findings.Severity`` (a test checks they agree): ``findings`` builds pydantic models, which
#: a match never needs.
Severity = Literal["critical", "warning", "info"]

__all__ = ["Match", "MatchResult", "Matcher", "get_matcher", "match"]

OUT_OF_SCOPE_ID = "out-of-scope"

#: Field weights of the BM25F index: where a word appears says how much it tells.
FIELD_WEIGHTS: dict[str, float] = {
    "title": 3.0,
    "id": 2.0,
    "claim": 3.0,
    "keywords": 2.5,
    "paraphrases": 2.0,
    "phrasings": 2.0,
    "summary": 1.5,
    "description": 1.5,
    "what": 1.0,
    "shows_up": 1.0,
    "why": 0.5,
    "confirm": 0.4,
    "fix": 0.4,
    "say_instead": 0.5,
    "first_checks": 0.4,
    "seed_correction": 0.3,
}
#: Fields whose items are each a complete way of saying the entry (nearest-sentence bonus).
SENTENCE_FIELDS: tuple[str, ...] = ("title", "claim", "paraphrases", "phrasings")

_K1 = 1.2
_B = 0.75
_PHRASE_WEIGHT = 1.5
#: Weight of a word that appears only in pasted code (see ``Matcher._soften_code_terms``).
_CODE_TERM_WEIGHT = 0.5
_RELATED_WEIGHT = 0.5
#: Bonus (in score units) of a nearest-sentence similarity of 1.0.
_SENTENCE_BONUS = 6.0
#: Score added by a fully confident number or code rule (strength 1.0).
_EVIDENCE_WEIGHT = 20.0
#: Bonus when every word of the entry's id appears in the text ("vanishing gradients").
_NAMED_BONUS = 4.0
_RATIONALIZATION_PRIOR = 1.3
#: Word score kept by an entry whose premise the text lacks (see ``_PREMISES``).
_UNSUPPORTED_PRIOR = 0.6
#: Further share kept by a rationalization whose premise the text lacks.
_UNSUPPORTED_CLAIM_PRIOR = 0.75
#: Word score kept by a loss-movement symptom when the text has no word of movement.
_NO_MOVEMENT_PRIOR = 0.5
_SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}
_RATIONALIZATION_REPORT_PRIOR = 0.85
_SYMPTOM_PRIOR = 1.15
_RED_FLAG_CODE_PRIOR = 1.2
_RED_FLAG_ADVICE_PRIOR = 0.85
_SYMPTOM_CLAIM_PRIOR = 0.85
#: Share of a rationalization's word score on the claim part of the text (see ``_CLAIM_START``)
#: added to its score: the claim, not the report before it, says which belief is held.
_CLAIM_PART_WEIGHT = 0.6
#: Where a belief or a plan starts in a text that first tells what happened ("loss went nan at
#: step 900. I'll suggest swapping to SGD", "NaN at epoch 7, so there must be bad rows").
_CLAIM_START = _regex.compile(
    r"(?:^|[\s,;:.!?(-])(?:so(?!\s+(?:far|much|many|that|long|the|it|is|was)\b)|therefore|hence|"
    r"thus|clearly|obviously|surely|probably|must\s+(?:be|contain|have|come|include)|"
    r"conclusion\s*:|replace|(?:is|are)\s+known\s+to|(?:want|wants|plan|plans|planning|"
    r"intend\w*)\s+to|i'll|i\s+will|i'd|i\s+would|i'm\s+"
    r"going\s+to|we'll|we\s+will|we're\s+going\s+to|let's|(?:my|the|our)\s+plan|"
    r"(?:i|we)\s+(?:think|bet|guess|suspect|believe)|suggest\w*|recommend\w*|which\s+means|"
    r"that\s+means|(?:i|we)\s+(?:took|take|removed?|dropped?|turned)\s+(?:out|off)|"
    r"(?:i'm|we're)\s+(?:leaving|keeping|writing|going|moving|switching|dropping|removing))\b",
    re.IGNORECASE,
)
_MAX_TEXT = 20_000
_GARBAGE_MIN_TERMS = 20
_GARBAGE_KNOWN_FRACTION = 0.3

_ASSERTION = _regex.compile(
    r"(?:^|[.;:,!?]\s*)(?:just\s+|simply\s+)?(?:use|try|swap|switch|replace|skip|reduce|divide|drop|lower|"
    r"raise|increase|bump|add|remove|set|avoid|pick|choose|rent|buy|shrink|simplify|rescale|"
    r"scale|cut|go|stick|forget|ignore)\b|"
    r"\bbetter\s+(?:to|than)\b|\brather\s+than\b|\btherefore\b|"
    # "so I copied a trick", "so we compared the logs": what the writer did, not a rule.
    # ("so we disabled clipping" acts on the belief told before it, and stays a claim.)
    r"\bso\s+(?:(?:i|we)(?!\s+(?:copied|wrote|built|ran|compare[ds]?|check(?:ed|s)?|"
    r"print(?:ed|s)?|log(?:ged|s)?|plotted|measured)\b)|you)\b|"
    r"\b(?:you'll|you\s+will|you'd|(?:have|has)\s+to|until\s+(?:we|i|you)\s+(?:get|buy|have))\b|"
    # "just" as a degree or comparison ("looks just like batch 32", "just as noisy", "just
    # before the spike") describes a run; only "just do X" advises.
    r"\b(?:just(?!\s+(?:like|as|the\s+same|fine|now|before|after|once|when|a\s+few|about|"
    r"under|over|below|above)\b)|you\s+should(?:n't)?|you\s+need|you\s+must|we\s+should|"
    r"i'd(?!\s+(?:like|need|want|have\s+to))|"
    r"i\s+would(?!\s+(?:like|need|want|have\s+to))|"
    r"i'll|i\s+will|let's|(?<!i'm\s)(?<!\bam\s)(?<!we're\s)(?<!\bare\s)try(?:ing)?|don't\s+need|no\s+need|not\s+needed|unnecessary|"
    r"doesn't\s+matter|is\s+(?:a|just\s+a)\s+(?:hack|trick)|obviously|clearly|"
    r"must\s+(?:be|contain|have|come|include)|(?:is|are)\s+known\s+to|conclusion\s*:|"
    # A plan to act is the belief behind it: "they want to drop it to 0.01".
    r"(?:want|wants|plan|plans|planning|intend\w*)\s+to\s+(?:drop|set|lower|cut|reduce|raise|"
    r"increase|switch|swap|replace|remove|turn\s+off|skip|use|bump)|"
    r"it's\s+because|that's\s+why|probably|i\s+think|i\s+bet|i\s+guess|recommend|"
    r"suggest|the\s+fix\s+is|the\s+answer\s+is|go\s+with|instead|won't|can't|cannot|isn't|"
    r"doesn't|don't|shouldn't|no\s+point|pointless|overkill|waste|bad\s+idea|incompatible|"
    r"fight\w*\s+each\s+other|interfere\w*|conflict\w*)\b"
    # A consequence stated as a rule: "X changes the norm, so clipping gives wrong values".
    r"|,\s*so\s+[^.;\n]{0,40}\b(?:gives?|returns?|is|are|becomes?)\s+(?:\w+\s+)?(?:wrong|"
    r"incorrect|broken|meaningless|useless)\b",
    re.IGNORECASE,
)
#: Negations that mark a claim only when nobody is describing their own run.
_WEAK_NEGATION = _regex.compile(
    r"\b(?:can't|cannot|isn't|doesn't|don't|won't|can\s+not|does\s+not|do\s+not|is\s+not)\b",
    re.IGNORECASE,
)
_STRONG_ASSERTION = _ASSERTION
_FIRST_PERSON = _regex.compile(r"\b(?:my|i|i'm|i've|we|our|we're)\b", re.IGNORECASE)
_REPORT = _regex.compile(
    r"\b(?:my|i'm\s+getting|i\s+get|i\s+see|i'm\s+seeing|we\s+see|we're\s+seeing|keeps?|kept|"
    r"after\s+\d+|epochs?|steps?\s+\d+|iterations?|why\s+(?:is|does|do)|what's\s+wrong|"
    r"i'?d\s+need|i\s+need|"
    r"started|starts|suddenly|goes|went|became|becomes|every\s+(?:single\s+)?step|i'd\s+like|"
    r"i\s+want|how\s+can\s+i|how\s+do\s+i)\b",
    re.IGNORECASE,
)
#: Symptoms that describe how the loss moves: a text with no word of movement or judgement
#: ("Epoch 12 | train loss 0.41 | val loss 0.46 | all fine?") is not reporting one of them.
_MOVEMENT_SYMPTOMS = frozenset(
    {
        "overfitting",
        "underfitting",
        "plateau",
        "loss-stuck",
        "loss-spikes",
        "diverges-after-stable-start",
        "loss-down-then-up-with-accumulation",
    }
)
_MOVEMENT = _regex.compile(
    r"\b(?:up|down|ris\w*|rose|fall\w*|fell|increas\w*|decreas\w*|climb\w*|drop\w*|grow\w*|"
    r"shrink\w*|stuck|flat\w*|plateau\w*|stall\w*|stagnat\w*|high\w*|low\w*|worse|better|"
    r"improv\w*|diverg\w*|explod\w*|spik\w*|jump\w*|oscillat\w*|fluctuat\w*|bounc\w*|"
    r"barely|slow\w*|fast\w*|gap|overfit\w*|underfit\w*|generali[sz]\w*|memori[sz]\w*|"
    r"learn\w*|poor\w*|bad|nan|inf|blow\w*|blew|moving|move[sd]?|chang\w*|same|constant|"
    r"never|won't|doesn't|don't|isn't|not|hover\w*|stays?|stayed|remains?|bottom\w*|"
    r"converg\w*|degrad\w*|recover\w*|again)\b",
    re.IGNORECASE,
)
#: The technique a red flag (or a claim about one technique) is about; a text that never names
#: it gets the entry's word score cut (keys ending in "-" cover every id with that prefix).
#: What a per-layer profile reading explains (see ``matcher_frames.layer_profile_hits``).
_PROFILE_EXPLAINS = {"vanishing-gradients": ("loss-stuck", "plateau")}
#: Clipping named in any form (clip_grad_norm_, max_norm, gradient_clip_val ...).
_CLIPPING = _regex.compile(r"clip|max_norm|max_grad_norm", re.IGNORECASE)
_PREMISES: dict[str, re.Pattern[str]] = {
    key: _regex.compile(pattern, re.IGNORECASE)
    for key, pattern in {
        "saturating-deep-net": r"sigmoid|tanh|saturat|logistic|squash",
        "amp-": r"\bamp\b|fp16|float16|half|mixed|scaler|unscale|autocast|bf16|bfloat16|"
        r"loss[\s_]scal|apex",
        "ddp-": r"ddp|distributed|no_sync|\branks?\b|multi-?gpu|gpus|nodes|all[-_\s]?reduce|"
        r"world[_\s]size|torchrun|fsdp|horovod|data[\s-]parallel|replica",
        "accum-": r"accum|micro[-\s]?(?:batch|step)|effective\s+batch",
        # The symptoms that exist only with accumulation.
        "loss-down-then-up-with-accumulation": r"accum|micro[-\s]?(?:batch|step)|effective\s+batch",
        "accumulation-worse-than-small-batch": r"accum|micro[-\s]?(?:batch|step)|effective\s+batch",
        # The no_sync red flags are about synchronisation, not any slow DDP run.
        "ddp-accum-without-no-sync": r"sync|all[-_\s]?reduc|communicat",
        "ddp-no-sync-misplaced": r"sync|all[-_\s]?reduc|communicat",
        "clip-": r"clip",
        # Lowering the learning rate needs the learning rate in the text ("loss went nan" alone
        # is the symptom, not the belief that a smaller LR cures it).
        "lower-lr-for-nan": r"\blr\b|learning[\s_-]*rates?|step[\s_-]?size|\blrs\b|_lr\b|\blr_",
        # Blaming the data needs the data in the text ("the NaN is the learning rate" is not).
        "nan-means-bad-data": r"data|sample|input|batch|record|corrupt|example|label|target|"
        r"image|row|file|token|feature|corpus|shard|parquet|jsonl|csv",
        "value-clipping": r"clip",
        "no-clip-sequence-model": r"clip|lstm|gru|rnn|transformer|gpt|bert|t5|llm|seq2seq|"
        r"language\s+model|policy|ppo|attention|sequence",
        # Rationalizations about one technique.
        "batchnorm-optional": r"batch[\s_-]?norm|normali[sz]|\bbn\b|layer[\s_-]?norm",
        "residuals-are-a-trick": r"residual|skip[\s-]connection|shortcut|resnet",
        "checkpointing-breaks-clipping": r"checkpoint|recomput",
        "lightning-needs-manual-clipping": r"lightning|\bpl\.|trainer",
        "ddp-handles-everything": r"ddp|distributed|data[\s-]parallel|gpus|ranks?\b|sync",
        "paper-did-not-clip": r"paper|authors?|repo|publication|reference|official|original|"
        r"reproduc|recipe",
        "paper-does-not-mention-clipping": r"paper|authors?|publication|article|mention",
        "transformers-are-unstable": r"transformer|attention|llm|gpt|bert|t5|language\s+model|"
        r"\bvit\b",
        "amp-breaks-clipping": r"\bamp\b|fp16|float16|half|mixed|scaler|autocast|bf16|precision",
        "accumulation-is-complicated": r"accum|micro[-\s]?batch",
        "complex-models-always-unstable": r"complex|big|large|huge|billion|\d+\s*[bm]\b|param|deep|"
        r"architecture|model",
        "scale-grads-not-loss": r"accum|micro[-\s]?batch|\.grad|grads?\b|gradients",
        "accum-scale-depends-on-batch": r"accum|micro[-\s]?batch|divisor|scal",
        # The memory beliefs need their remedy in the text (a smaller model, bigger hardware):
        # "OOM at batch 16, how do I reach 64?" holds neither belief, only the symptom.
        "smaller-model-for-memory": r"smaller|shrink|downsiz|slimmer|"
        r"(?:fewer|less)\s+(?:\w+\s+)?(?:layers|blocks|parameters|params|heads|channels|units)|"
        r"lighter\s+(?:\w+\s+)?(?:model|architecture|network|net|backbone)|"
        r"\bbase\s+(?:model|version|variant|one)|instead\s+of\s+the\s+(?:large|big)|"
        r"cut\w*\s+(?:down\s+)?(?:the\s+)?(?:number|layers|depth|width|hidden|model)|"
        r"(?:reduc|drop|lower|decreas)\w*\s+(?:the\s+)?(?:hidden|depth|width|layers?|d_model|"
        r"model|parameters|blocks)|hidden[\s_]size|d_model|distil|prun|capacity|variant|"
        r"too\s+(?:big|large)|\btiny\b|\bmini\b",
        "need-bigger-gpus": r"\b(?:bigger|better|beter|larger|more|faster|expensive|another|"
        r"second|extra)\s+(?:\w+\s+)?(?:gpus?|cards?|vram|hardware|machines?|nodes?|memory)\b|"
        r"\bbuy|\brent|upgrad|\ba100|\bh100|\bh200|\b(?:40|48|80)\s*gb|\bcloud|cluster|"
        r"expensive|\bneeds?\s+(?:an?\s+)?(?:gpu|card)|nothing\s+i\s+can\s+do",
        # A loss that stays put needs the loss (or the training, a metric) in the text: "the
        # norm is flat after step 200" is about the norm.
        "plateau": r"loss|ppl|perplexity|acc|metric|learn|train|improv|progress|score|\bf1\b|bleu|"
        r"converg|model|stuck|plateau|stall|epoch|\bval|eval",
        "loss-stuck": r"loss|ppl|perplexity|acc|metric|learn|train|improv|progress|score|\bf1\b|"
        r"bleu|converg|model|stuck|plateau|stall|epoch|\bval|eval",
        # Whether to clip is a question about clipping.
        "is-clipping-needed": r"clip",
        # The belief that small gradients mean a broken model needs gradients called small (or
        # a small number): per-layer norms of 0.3-1.1 next to dead units do not hold it.
        "small-grads-mean-broken": r"small|tiny|minuscule|vanish|near\s+zero|close\s+to\s+zero|"
        r"\blow\b|lower|little|weak|[0-9]e-\d|0\.00|shrink|decay|\bzero",
        # Trends of the gradient norm need the gradients or their norm in the text (a loss
        # that jumps and recovers is not a norm spike).
        "grad-": r"grad|norm",
        # A non-finite loss needs a non-finite value (or a blow-up) in the text.
        "loss-nan": r"nan|\binf|non-?finite|not\s+finite|undefined|overflow|diverg|explod|blow|"
        r"blew|isfinite|isnan|isinf",
        # Clipping that did not stop a NaN needs the NaN (or a blow-up) and clipping in the
        # text: a NaN hunt that never mentions a clip is not about the clip's failure.
        "clipping-did-not-fix-nan": r"^(?=[\s\S]*clip)[\s\S]*(?:nan|\binf|non-?finite|diverg|"
        r"explod|blow|blew)",
    }.items()
}
_STILL_LEARNING = _regex.compile(
    r"\b(?:loss|metrics?|accuracy|validation|val|training)\b[^.\n]{0,40}?\b(?:still|steadily|"
    r"nicely|fine|keeps?)\b[^.\n]{0,20}?\b(?:fall|falling|decreas\w*|drop\w*|going\s+down|goes\s+"
    r"down|improv\w*|learn\w*|fine|ok|okay|good)|\b(?:loss|training)\b[^.\n]{0,30}?\b(?:is|are)\s+"
    r"(?:decreasing|improving|falling|dropping|fine)\b|\bconverg\w*\s+(?:fine|well|ok)",
    re.IGNORECASE,
)

_SMALL_GRADS = _regex.compile(
    r"\b(?:small|tiny|minuscule|vanish\w*|near\s+zero|close\s+to\s+zero)\b[^.\n]{0,20}\bgrad"
    r"|\bgrad\w*\b[^.\n]{0,25}\b(?:small|tiny|minuscule|vanish\w*|near\s+zero)\b",
    re.IGNORECASE,
)

#: The loss (or perplexity) getting better, and a score (accuracy, F1, ...) getting better.
_LOSS_IMPROVING = _regex.compile(
    r"\b(?:loss(?:es)?|perplexity|ppl)\b(?P<between>[^.;,\n]{0,30}?)\b(?:going\s+down|goes\s+down|"
    r"went\s+down|decreas\w*|dropping|drops|falling|falls|improv\w*|converg\w*)",
    re.IGNORECASE,
)
_SCORE_IMPROVING = _regex.compile(
    r"\b(?:acc(?:uracy)?|f1|bleu|auc|map|metrics?|scores?|rouge|iou|dice|reward)\b"
    r"(?P<between>[^.;,\n]{0,30}?)\b(?:going\s+up|goes\s+up|went\s+up|increas\w*|rising|rises|"
    r"climb\w*|improv\w*|better)",
    re.IGNORECASE,
)
#: Another quantity between a metric and its verb: the verb is about that one.
_OTHER_METRIC = _regex.compile(
    r"\b(?:loss(?:es)?|acc(?:uracy)?|norms?|grad\w*|lr|learning\s+rate)\b", re.IGNORECASE
)
#: Two quantities sharing one verb: "loss and val loss both going down", "loss and accuracy".
_SHARED_VERB = _regex.compile(
    r"\s*(?:and|&|,|as\s+well\s+as)\s+(?:the\s+)?(?:(?:train\w*|val\w*|validation|test|eval\w*)"
    r"[_ ])?(?:loss(?:es)?|acc(?:uracy)?|ppl|perplexity)(?:\s+(?:both|all|each|too))?"
    r"(?:\s+(?:keep|kept|are|were|is|have\s+been|both))*\s*",
    re.IGNORECASE,
)
#: The held-out set named after the verb: "keep improving on train and val".
_ON_HELD_OUT = _regex.compile(
    r"\s*(?:\w+\s+)?(?:on|for|in)\s+(?:both\s+)?(?:the\s+)?(?:train\w*\s+(?:and|&)\s+)?"
    r"(?:val(?:idation)?|held[-\s]?out|test|dev|eval)\b",
    re.IGNORECASE,
)
_NEGATED = _regex.compile(
    r"\b(?:not|never|no\s+longer|stopped|barely|hardly|isn't|doesn't|won't)\b|n't\b"
)
_HELD_OUT_ANY = _regex.compile(
    r"\b(?:val\w*|eval\w*|test\w*|dev|held[-\s]?out|generali[sz]\w*|unseen|overfit\w*)\b",
    re.IGNORECASE,
)
#: A held-out loss said to worsen: rising, going up, or best at an earlier epoch ("val loss
#: rising since epoch 6", "val logloss best at epoch 2 (0.452), 0.471 by epoch 6"). A report of
#: training dynamics (overfitting), whatever the text says of its data set.
_HELD_OUT_WORSENS = _regex.compile(
    r"\b(?:val(?:idation)?|eval|dev|test|held[-\s]?out)[\s_/-]*(?:set\s+)?(?:log[\s_-]?)?"
    r"loss(?:es)?\b[^.;?!\n]{0,30}?\b(?:ris(?:es|ing)|rose|climb\w*|increas\w*|"
    r"(?:goes|going|went|creep\w*|tick\w*)\s+(?:back\s+)?up|worse\w*|"
    r"best\s+(?:at|in|after|around)\s+(?:epoch|ep|step)s?\b)",
    re.IGNORECASE,
)
#: The training loss said to rise too: both losses rising is divergence, not overfitting.
_TRAIN_LOSS_RISES = _regex.compile(
    r"\b(?:train(?:ing)?|both)[\s_/-]*(?:(?:log[\s_-]?)?loss(?:es)?\b)?[^.;?!\n]{0,30}?"
    r"\b(?:ris(?:es|ing)|rose|climb\w*|increas\w*|(?:goes|going|went)\s+up)",
    re.IGNORECASE,
)
_HELD_OUT = _regex.compile(r"\b(?:val(?:idation)?|eval\w*|test|dev)\b", re.IGNORECASE)
#: The text asks whether what it shows is normal ("is that normal?", "anything to worry about?").
_NORMAL_QUESTION = _regex.compile(
    r"\b(?:is\s+(?:this|that|it)\s+(?:normal|expected|ok(?:ay)?|fine|healthy|a\s+problem|bad)"
    r"|(?:normal|expected|ok(?:ay)?|fine)\s*\?|anything\s+to\s+worry|should\s+i\s+(?:be\s+)?worr"
    r"|nothing\s+(?:wrong|to\s+worry|weird)|worth\s+worrying|(?:looks?|seems?)\s+(?:fine|ok(?:ay)?|"
    r"normal|healthy)|is\s+(?:something|anything)\s+wrong|right\s*\?|reason\s+to\s+worry"
    r"|need\s+to\s+worry|cause\s+for\s+concern|(?:a|any)\s+problem\s*\?|concern(?:ed|ing)?\s*\?"
    r"|all\s+(?:good|fine|ok(?:ay)?)\s*\?|balance\s+ok|(?:anything|something)\s+(?:that\s+)?"
    r"looks?\s+(?:off|wrong|weird|strange|odd)|looks?\s+off\s*\?|is\s+(?:that|this|it)\s+(?:too\s+)?"
    r"(?:high|low|big|large|small)\s*\?|(?:any|see\s+any|spot\s+any)\s+(?:red\s+flags?|issues?|"
    r"problems?)\s*\?|should\s+(?:i|we)\s+(?:change|worry\s+about|fix|tweak|do)\s+anything"
    # "Is there anything to fix here?", "Does anything here need fixing?"
    r"|anything\s+(?:i'm|i\s+am|we're|we\s+are)\s+missing"
    r"|anything\s+(?:(?:seems?|looks?)\s+)?(?:off|wrong|weird|odd)\s*\?"
    r"|anything\s+(?:here\s+)?(?:to\s+(?:fix|change)|(?:that\s+)?needs?\s+(?:fixing|changing|to\s+be\s+"
    r"(?:fixed|changed)|attention))|(?:don't|do\s+not)\s+see\s+what\b)",
    re.IGNORECASE,
)
#: The text hands over code to be checked ("anything wrong in here?", "double-check the order
#: of the calls", "is this step right?") rather than telling what went wrong with it.
_REVIEW_REQUEST = _regex.compile(
    r"\b(?:double[-\s]?check\w*|sanity[-\s]?check\w*|check\s+(?:over\s+)?(?:the|my|this|our|their|"
    r"it|if|whether)|review\w*|proof[-\s]?read|look\s+(?:it\s+)?over|(?:anything|something)\s+"
    r"(?:\w+\s+)?(?:wrong|off|missing|amiss)|(?:is|are)\s+(?:this|that|it|these|my|the)\b[^.?\n]{0,40}"
    r"\b(?:right|correct|ok(?:ay)?|fine)\b|(?:look|looks|seem|seems)\s+(?:right|correct|ok(?:ay)?|"
    r"fine|off|wrong)|worried|not\s+sure\s+(?:if|whether|about)|did\s+(?:i|we|they)\s+get|"
    r"(?:got|get)\s+(?:the\s+)?\w+(?:\s+\w+)?\s+(?:wrong|right)|order\s+of\s+(?:the\s+)?calls|"
    r"before\s+(?:i|we|they)\s+(?:launch|start|run|kick|submit))",
    re.IGNORECASE,
)
#: Words of something having gone wrong in a run: then the code is read for its cause, and a
#: clean fragment is not a clean run.
_RUN_PROBLEM = _regex.compile(
    r"\b(?:nan\w*|inf|infinite|non-?finite|overflow\w*|diverg\w*|explod\w*|blow\w*|blew|spik\w*|"
    r"stuck|plateau\w*|stall\w*|flat|not\s+learn\w*|doesn't\s+learn|barely|slow\w*|worse|oom|"
    r"out\s+of\s+memory|crash\w*|error\w*|exception|traceback|identical|zero|jump\w*|"
    r"oscillat\w*|fluctuat\w*|unstable|instabilit\w*|noisy|rising|rises|rose|climb\w*|"
    r"increas\w*|drops?\s+to|dropped|collaps\w*|skipp\w*|tiny|huge|vanish\w*|dead|"
    r"degrad\w*|regress\w*|hang\w*|deadlock\w*|mismatch\w*|differ\w*)\b|\b0\.0\b",
    re.IGNORECASE,
)
#: A fragment with both of these is a training step the analyser can judge as a whole.
_BACKWARD_CALL = _regex.compile(r"\.backward\s*\(|\bbackward\s*\(")
_STEP_CALL = _regex.compile(r"\.step\s*\(")
#: A static finding about what a whole script lacks, which a pasted step rarely shows (the
#: norm is logged elsewhere). The leftover micro-batches are in the loop shown: they count.
_WHOLE_SCRIPT_NOTES = frozenset({"no-grad-monitoring"})
#: Red flags about the order or placement of calls in one step: the analyser finds each of
#: them in a whole step that has it, so a whole step it reads without one does not have it.
_ORDER_RED_FLAGS = frozenset(
    {
        "clip-after-step",
        "clip-before-backward",
        "amp-clip-without-unscale",
        "amp-step-bypasses-scaler",
        "amp-double-unscale",
        "accum-clip-every-microstep",
        "accum-zero-grad-every-microstep",
        "accum-scheduler-per-microbatch",
        "monitor-after-zero-grad",
        "ddp-no-sync-misplaced",
    }
)
#: Word score kept by an order red flag the analyser did not find in a whole step it read.
_NOT_IN_CODE_PRIOR = 0.6
#: A broader entry when a rule read the narrower one it contains.
_SUPERSEDED_PRIOR = 0.6
#: Least sureness of a code finding that answers a review request on its own.
_REVIEWED_FINDING = 0.5
#: Entries that answer "should I use <technique>?", with the technique's name.
_WHETHER_TO_USE = {"is-clipping-needed": "clip"}
#: A belief about another technique than the one a should-I-use question asks about.
_OTHER_TECHNIQUE_PRIOR = 0.6
#: A belief whose subject the text measured and found (a check's result, not a guess).
_MEASURED_BELIEF_PRIOR = 0.5
#: A stable start told before the run itself falls apart, no quantity named.
_STABLE_THEN_FELL_APART = _regex.compile(
    r"\b(?:stable|stably|fine|perfect\w*|smooth\w*|great|healthy|beautiful\w*|nicely)\b"
    r"[^.;\n]{0,80}\b(?:then|until|but|suddenly|abruptly)\b[^.;\n]{0,60}\b(?:f[ae]ll(?:s|ing)?\s+"
    r"apart|diverg\w*|blew\s+up|blows?\s+up|exploded|went\s+off\s+the\s+rails)",
    re.IGNORECASE,
)
#: The entries about gradients too small, and too large: a measured norm of the other size
#: rules them out.
_SMALL_GRADIENT_ENTRIES = frozenset({"grad-norm-decaying", "zero-gradients", "vanishing-gradients"})
_LARGE_GRADIENT_ENTRIES = frozenset({"exploding-gradients", "grad-norm-rising", "inf-gradients"})
#: An entry whose trend words a frame gave to another quantity, or that a healthy frame contradicts.
_FRAME_DISCOUNT = 0.6
#: "the loss curve looks textbook": the run is said to go well.
_LOOKS_GOOD = _regex.compile(
    r"\b(?:loss|curves?|training|metrics?|run)\b[^.;,\n]{0,20}\b(?:looks?|seems?|is)\s+"
    r"(?:textbook|good|great|nice|clean|healthy|normal|fine|as\s+expected)\b"
    r"|\b(?:learns?|learning|trains?|training|converges?|converging|fits?)\s+(?:just\s+)?(?:fine|"
    r"well|ok(?:ay)?|normally|nicely)\b"
    r"|\b(?:loss|curves?)\s+(?:curves?\s+)?(?:is\s+|are\s+|looks?\s+|stays?\s+)?smooth\b"
    # "top-1 tracking the reference curve": the run keeps up with a known-good one.
    r"|\b(?:track(?:s|ing)?|match(?:es|ing)?|follow(?:s|ing)?|on\s+par\s+with)\s+(?:the\s+|our\s+)?"
    r"(?:reference|baseline|published|paper's|expected)\s+(?:run|curve|numbers?|results?)\b",
    re.IGNORECASE,
)
#: How many times its best value a loss series must end at to be called diverging, and how far
#: above both neighbours a single value must jump to be a spike. The seeds give no numbers for
#: a loss written in a sentence; these are the matcher's reading, not diagnosis thresholds.
_LOSS_DIVERGING_FACTOR = 3.0
#: Per-layer norms listed in a monotone order (|Spearman| at least this): a fade through depth.
_LAYER_ORDER_CORRELATION = 0.9
#: Words of an unstable run (for a clip that never fires while it is).
_UNSTABLE = _regex.compile(
    r"\b(?:diverg\w*|spik\w*|nan|inf|explod\w*|blow\w*|blew|unstable|instabilit\w*|jump\w*|"
    r"oscillat\w*)\b",
    re.IGNORECASE,
)
#: The text says the large value is an exception ("except at", "every so often").
_OCCASIONAL = _regex.compile(
    r"\b(?:except|apart\s+from|other\s+than|but\s+(?:at|on)|occasionally|sometimes|every\s+so\s+"
    r"often|once\s+in\s+a\s+while|now\s+and\s+then|from\s+time\s+to\s+time|(?:a\s+)?few\s+steps|"
    r"some\s+steps|(?<!every\s)(?<!each\s)single\s+steps?|random\s+steps|mostly|usually|typically|"
    r"most\s+of\s+the\s+time|"
    r"most\s+steps)\b",
    re.IGNORECASE,
)
#: Gradients said not to be exactly zero ("no parameter with an exactly zero gradient").
_ZERO_DENIED = _regex.compile(
    r"\b(?:no|none(?:\s+of\s+(?:them|the\s+\w+))?|not\s+(?:a\s+single|one)|never)\b[^.;\n]{0,40}?"
    r"\b(?:exactly|precisely|literally)\s+(?:zero|0)\b(?!\.\d)",
    re.IGNORECASE,
)
_EVERY_STEP = _regex.compile(
    r"\b(?:every|each|all)\s+(?:single\s+)?(?:step|iteration|batch)|\balways\b", re.IGNORECASE
)
#: The usual order of ||Δw||/||w|| and how far from it a value must be to be reported (two
#: orders of magnitude): the update-param-ratio entry's own numbers, no seed gives one.
_UPDATE_RATIO_USUAL = 1e-3
_UPDATE_RATIO_FACTOR = 100.0
_LOSS_SPIKE_FACTOR = 2.0
#: A loss that rises at every reading after its best, to this multiple of it, is diverging.
_LOSS_CLIMB_FACTOR = 2.0
#: A grad norm that grows at every reading (4+ readings) by at least this much overall is
#: read as rising even below the probe's 10× line (the matcher's own reading of a trend told
#: in words, not a diagnosis threshold).
_STEADY_RISE_FACTOR = 4.0
#: A held-out loss that ends this much above where it started has gone up (two readings).
_HELD_OUT_RISE_FACTOR = 1.3
#: Within this factor of its usual order, a ratio is in its usual order.
_USUAL_ORDER_FACTOR = 10.0
#: A GradScaler scale said to hold at or above this is working (it starts at 2**16 and halves
#: on each overflowing step, so a scale that stays high sees few of them); below 1 it has
#: collapsed. The matcher's own reading of GM's AMP flow, not a diagnosis threshold.
_AMP_SCALE_STEADY = 2.0**10
_AMP_SCALE_COLLAPSED = 1.0
#: A loss series whose values all lie within this fraction of each other is flat.
_LOSS_FLAT_FRACTION = 0.03


@dataclass
class _Progress:
    """What the text says about training progress, from words and number series."""

    improving: bool = False
    held_out_improving: bool = False
    #: Held-out results follow the training ones ("val loss tracks train loss closely").
    no_gap: bool = False
    #: Words saying a value stays where it is ("then sits at 2.5 for the next 40k").
    holds_level: bool = False
    #: Words saying a later value is the same as an earlier one ("and still 4.6 at step 20k").
    same_again: bool = False
    normal_question: bool = False
    #: The run accumulates gradients (a loss that falls then rises is then its own symptom).
    accumulating: bool = False
    #: Two norms tied to two layers ("the first conv layer 3e-9, the last layer 1e-2").
    layer_pair: bool = False
    #: ... and the early layer is named first.
    early_layer_first: bool = True
    #: Words saying a value goes back and forth ("from 0.4 to 2 and back").
    comes_back: bool = False
    #: The loss is said to keep rising ("still rising", "climbs back", "keeps going up").
    keeps_rising: bool = False
    reasons: list[str] = field(default_factory=list)


#: Held-out results said to follow the training ones: no generalisation gap.
_NO_GAP = _regex.compile(
    r"\b(?:val(?:idation)?|eval\w*|test|dev|held[-\s]?out)[_ ]?(?:loss(?:es)?|ppl|perplexity|"
    r"acc(?:uracy)?|curves?|metrics?)?\b[^.;\n]{0,20}?\b(?:tracks?|tracking|follows?|following|"
    r"matches|mirrors?|mirroring|(?:stays?|is|are|remains?)\s+(?:very\s+)?close\s+to|in\s+line\s+"
    r"with|right\s+with|on\s+par\s+with)\b[^.;\n]{0,15}?\btrain"
    r"|\bno\s+(?:real\s+|big\s+|noticeable\s+)?gap\s+between\s+(?:the\s+)?(?:train\w*|val\w*)",
    re.IGNORECASE,
)
#: Words that call the losses high or stuck: what underfitting is.
_LOSS_BAD_LEVEL = _regex.compile(
    r"\b(?:high|stuck|flat|plateau\w*|stall\w*|poor\w*|bad|terrible|random|chance|"
    r"not\s+(?:learning|improving|decreasing|going\s+down)|doesn't\s+(?:learn|improve|go\s+down)|"
    r"won't\s+(?:learn|improve|go\s+down)|barely|underfit\w*)\b",
    re.IGNORECASE,
)


_HOLDS_LEVEL = _regex.compile(
    r"\b(?:sits?|sat|stays?|stayed|stuck|flat\w*|plateau\w*|hover\w*|unchanged|stall\w*|"
    r"levels?\s+off|levell?ed\s+off|for\s+the\s+(?:next|rest|last|remaining)|ever\s+since|"
    r"since\s+then|doesn't\s+move|not\s+moving|won't\s+budge)\b",
    re.IGNORECASE,
)


#: A loss series that ends at or below this share of its start has come down.
_LOSS_FALLEN = 0.9
#: Words saying the loss itself is finite ("while the loss is still finite", "loss prints fine").
_LOSS_FINITE = _regex.compile(
    r"\bloss\w*\s+(?:itself\s+|value\s+)?(?:is|was|stays?|remains?|looks?|prints?|seems?)\s+"
    r"(?:still\s+)?(?:perfectly\s+)?(?:finite|fine|ok|okay|normal|not\s+nan)\b|\bfinite\s+loss",
    re.IGNORECASE,
)
#: A stage of the NaN tree the text says it checked and found clean ("the weights themselves
#: are still finite", "the batch has no NaN/Inf"): the NaN did not start there.
_CLEARED_STAGE: dict[str, re.Pattern[str]] = {
    "nan-parameters": _regex.compile(
        r"\b(?:weights?|params?|parameters?)\b(?:\s+themselves)?[^.;\n]{0,30}?(?:\b(?:are|were|is|"
        r"was|stay\w*|remain\w*|still|all|look\w*)\s+(?:(?:all|still|perfectly)\s+)*"
        r"(?:finite|clean|fine|ok(?:ay)?|normal)\b|"
        # "every weight passes torch.isfinite": a check that the stage passed.
        r"\bpass(?:es|ed)?\s+(?:the\s+|a\s+)?(?:torch\.)?(?:isfinite|finiteness|nan)\w*)",
        re.IGNORECASE,
    ),
    "nonfinite-inputs": _regex.compile(
        r"\b(?:inputs?|batch|x\s*/\s*y|tensors?|data|images?|samples?|features?)\b"
        r"(?![^.;\n]{0,40}\bother\b)[^.;\n]{0,40}?(?:\b(?:has|have|had|contain\w*|with)\s+no\s+"
        r"(?:nan|inf|non-?finite)|\b(?:is|are|was|were|look\w*)\s+(?:all\s+)?(?:clean|finite)\b|"
        r"\bnothing\s+(?:weird|wrong|odd|strange|unusual)|"
        r"\bpass(?:es|ed)?\s+(?:the\s+|a\s+)?(?:torch\.)?(?:isfinite|finiteness|nan)\w*)",
        re.IGNORECASE,
    ),
}
#: A monitor's count of non-finite values that reads zero ("nan=0", "inf_count: 0", "0 NaNs").
_ZERO_NAN_COUNT = _regex.compile(
    r"\b(?:nan|inf|non_?finite)s?(?:[_ ]?(?:count|values?|grads?|steps?))?\s*[=:]\s*0(?![.\d])"
    r"|\b0\s+(?:nan|inf)s?\b",
    re.IGNORECASE,
)
_NAN_WORD = _regex.compile(r"\b(?:nan|inf|non_?finite)s?\b", re.IGNORECASE)
_KEEPS_RISING = _regex.compile(
    r"\b(?:still|keeps?|kept|continu\w*\s+(?:to\s+)?)\s*(?:rising|rise|climbing|climb|going\s+up|"
    r"increasing|increase|growing)\b|\bclimbs?\s+back\b|\bclimb(?:ed|ing)?\s+back\b",
    re.IGNORECASE,
)
#: Two runs compared where only the precision differs: full precision trains, or the text
#: says the precision is the only change ("fp32: ... smooth", "only thing changed is the
#: precision flag").
_ONLY_PRECISION_DIFFERS = _regex.compile(
    r"\b(?:fp32|float32|full[\s-]precision)\b[^.;\n]{0,50}?\b(?:fine|ok(?:ay)?|smooth\w*|stable|"
    r"works?|converges?|trains?\s+(?:fine|well)|no\s+nan)\b"
    r"|\b(?:only|sole)\s+(?:thing|difference|change)\w*\b[^.;\n]{0,30}?\b(?:precision|dtype|fp16|"
    r"amp|autocast)",
    re.IGNORECASE,
)
_REDUCED_PRECISION = _regex.compile(
    r"\b(?:mixed[\s-]precision|amp|autocast|fp16|float16|half[\s-]precision|gradscaler)\b",
    re.IGNORECASE,
)
_PRECISION_EFFECTS = ("loss-nan", "loss-diverging", "loss-spikes", "exploding-gradients")
_FAILS = _regex.compile(r"\b(?:nan|inf|diverg\w*|blow\w*|blew|explod\w*|unstable)\b", re.IGNORECASE)
_SAME_AGAIN = _regex.compile(
    r"\b(?:still|same|unchanged|identical|exactly\s+where)\b", re.IGNORECASE
)


_COMES_BACK = _regex.compile(
    r"\b(?:and|then)\s+back\b|\bback\s+(?:down|again)\b|oscillat|jump\w*\s+around|bounc|"
    r"zig-?zag|fluctuat|up\s+and\s+down",
    re.IGNORECASE,
)
#: Gradient accumulation named in the text.
_ACCUMULATING = _regex.compile(r"accum|micro[-\s]?(?:batch|step)", re.IGNORECASE)
#: Two layers named by their place in the network, in one sentence: norms given for them
#: are per-layer values side by side, not a trend over time.
_LAYER_PAIR = _regex.compile(
    r"\b(?P<early>first|early|earliest|bottom|input|lowest|embedding)\w*\b[^.;\n]{0,60}\b(?:layer|linear|conv|block|lstm|gru)\w*"
    r"[^.;\n]{0,80}\b(?:last|late|final|top|output|head|deepest|classifier)\w*\b"
    r"|\b(?:last|late|final|top|output|head|deepest|classifier)\w*\b[^.;\n]{0,60}\b(?:layer|linear|conv|block|lstm|gru)\w*"
    r"[^.;\n]{0,80}\b(?:first|early|earliest|bottom|input|lowest|embedding)\w*\b",
    re.IGNORECASE,
)


def _progress(text: str) -> _Progress:
    progress = _Progress(
        normal_question=bool(_NORMAL_QUESTION.search(text)),
        accumulating=bool(_ACCUMULATING.search(text)),
        comes_back=bool(_COMES_BACK.search(text)),
        holds_level=bool(_HOLDS_LEVEL.search(text)),
        same_again=bool(_SAME_AGAIN.search(text)),
        keeps_rising=bool(_KEEPS_RISING.search(text)),
    )
    pair = _LAYER_PAIR.search(text)
    if pair is not None:
        progress.layer_pair = True
        progress.early_layer_first = pair.group("early") is not None
    if _NO_GAP.search(text):
        progress.no_gap = True
        if not _LOSS_BAD_LEVEL.search(text):
            # Held-out results keep up with training and nothing is called high or stuck:
            # the run is said to go well.
            progress.improving = True
            progress.reasons.append("held-out results follow the training ones")
    for pattern in (_LOSS_IMPROVING, _SCORE_IMPROVING):
        for m in pattern.finditer(text):
            between = m.group("between")
            if _NEGATED.search(between) or (
                # "train loss and val loss both going down": two subjects, one verb.
                _OTHER_METRIC.search(between) and not _SHARED_VERB.fullmatch(between)
            ):
                continue
            progress.improving = True
            progress.reasons.append(m.group(0))
            start = max(0, m.start() - 15)
            if _HELD_OUT.search(text[start : m.end()]) or _ON_HELD_OUT.match(text, m.end()):
                progress.held_out_improving = True
    if _STILL_LEARNING.search(text) or _LOOKS_GOOD.search(text):
        progress.improving = True
    return progress


_LR_QUESTION = _regex.compile(
    r"\b(?:lr|learning[\s_-]*rates?|schedul\w*|warm[\s-]?up|cosine|linear\s+decay|one[\s_-]?cycle|"
    r"step\s+decay|lr\s+finder|range\s+test|decay|annealing|cyclical|"
    # Scheduler and argument names: OneCycleLR, StepLR, max_lr, base_lr.
    r"\w*(?:cycle|step|cyclic|exponential)lr|\w+_lr)\b",
    re.IGNORECASE,
)
_DATA_QUESTION = _regex.compile(
    r"\b(?:augment\w*|csv|missing\s+values?|datasets?|data\s*loaders?|labels?|label\s+noise|"
    r"class\s+imbalance|imbalanced|tokeni[sz]\w*|preprocess\w*|clean(?:ing)?|dedup\w*|"
    r"train[\s/-]+test\s+split|split|images?|crop\w*|resiz\w*|rows?|columns?|pandas|parquet|"
    r"annotations?|scrap\w*|feature\s+engineering|outliers?\s+in\s+(?:the|my)\s+data|shuffl\w*|"
    r"tabular|normali[sz]\w*\s+(?:my\s+|the\s+)?(?:\w+\s+)?(?:features|inputs|data|images|pixels|"
    r"columns|targets)|early[\s-]stopping|"
    # How much to hold out for validation ("hold out 10% for validation", "20% as a val set").
    r"hold(?:ing)?\s+(?:back|out)\s+(?:\d+(?:\.\d+)?\s*%|(?:a|some|what)\s+(?:\w+\s+)?"
    r"(?:fraction|share|percent\w*|portion|part|proportion))|"
    r"hold(?:ing)?\s+(?:back|out)\b[^.?!\n]{0,40}?\b(?:for|as)\s+(?:an?\s+|the\s+)?(?:validation|val|"
    r"test|dev|evaluation)|"
    r"\d+(?:\.\d+)?\s*%\s+(?:of\s+(?:the\s+|my\s+|our\s+)?(?:data(?:set)?|samples|examples|images|"
    r"rows|records|corpus)\s+)?(?:for|as)\s+(?:an?\s+|the\s+)?(?:validation|val|test|dev|"
    r"hold[\s-]?out)|(?:validation|val|hold[\s-]?out|dev)\s+(?:fraction|ratio|proportion|"
    r"percentage|size))\b",
    re.IGNORECASE,
)
#: Questions about the training job's plumbing rather than its numbers: saving and resuming
#: from a checkpoint, the input pipeline's speed or hangs (workers, prefetching, GPU idle).
_TOOLING_QUESTION = _regex.compile(
    r"\b(?:resum\w*|restor\w*|reload\w*)\b[^.?!]{0,80}\b(?:checkpoints?|state[_ ]dicts?|\.pt|\.pth"
    r"|optimizer\s+state|epoch)\b|\bsav\w*\b[^.?!]{0,40}\bcheckpoints?\b[^.?!]{0,80}\bresum\w*"
    r"|\b(?:num_workers|persistent_workers|prefetch(?:_factor|\s+factor)?|pin_memory|data\s+loading"
    r"|input\s+pipeline|gpu\s+utili[sz]ation|nvidia-smi|samples?/s(?:ec)?|it/s|throughput)\b"
    r"|\b(?:data\s*loader|loader|workers?)\b[^.?!]{0,60}\b(?:hang\w*|freez\w*|deadlock\w*|stall\w*)\b"
    r"|\b(?:hang\w*|freez\w*|deadlock\w*)\b[^.?!]{0,60}\b(?:data\s*loader|loader|workers?)\b"
    r"|\berror\(s\)\s+in\s+loading\s+state_dict|\b(?:missing|unexpected)\s+key\(s\)"
    r"|\b(?:class\s+weights?|weighted\s+(?:cross[\s-]?entropy|loss|sampler)|weightedrandomsampler"
    r"|over[\s-]?sampl\w*|under[\s-]?sampl\w*|minority\s+class|positive\s+class|rare\s+class)\b"
    # Tensor shapes told in prose ("output is [32, 10] but targets come out as [32, 1, 10]"),
    # and sizing the hardware for a job ("how many GPUs do I need for a 13B model").
    r"|\[\d+(?:,\s*\d+)+\][^.?!\n]{0,80}\[\d+(?:,\s*\d+)+\]"
    r"|\b(?:extra|missing|wrong)\s+(?:dim(?:ension)?|axis)\b"
    r"|\bhow\s+many\s+(?:gpus|cards|nodes|a100s|h100s)\b"
    r"|\bhow\s+much\s+(?:vram|gpu\s+memory|memory)\s+(?:do|would|will|does)\b",
    re.IGNORECASE,
)
#: The error a state dict with the wrong key names gives when it is loaded.
_STATE_DICT_KEYS = _regex.compile(
    r"\berror\(s\)\s+in\s+loading\s+state_dict|\b(?:missing|unexpected)\s+key\(s\)",
    re.IGNORECASE,
)
#: A quantity said to be fine ("grads look fine", "loss and metrics are fine", "training is
#: stable") names no problem, and "an order of magnitude" is a factor, not a norm: a schedule or
#: plumbing question that says so is not ours for those words.
_QUANTITY_WORD = (
    r"(?:(?:train(?:ing)?\s+|val(?:idation)?\s+)?loss(?:es)?|grad(?:ient)?s?(?:\s+norms?)?|norms?|"
    r"metrics?|accuracy|curves?|training|everything)"
)
_FINE_CLAUSE = _regex.compile(
    rf"\b(?:the\s+)?{_QUANTITY_WORD}(?:\s*(?:,|and|&)\s*(?:the\s+)?{_QUANTITY_WORD})*"
    r"\s+(?:look|looks|are|is|seem|seems|trains?)\s+(?:\w+\s+)?(?:fine|ok|okay|normal|healthy|"
    r"good|stable|well[\s-]behaved)\b|\borders?\s+of\s+magnitude\b",
    re.IGNORECASE,
)
#: Words one of which every _FINE_CLAUSE match holds (a cheap test before the regex).
_FINE_WORDS = ("fine", "ok", "normal", "healthy", "good", "stable", "behaved", "magnitude")
#: What an LR range test is for: the loss blowing up at its high end is how it ends.
_LR_RANGE_TEST = _regex.compile(
    r"\b(?:lr|learning[\s_-]*rate)\s+(?:finder|range\s+test|sweep)|\brange\s+test\b|\blr_find\w*",
    re.IGNORECASE,
)
_TRAINING_QUANTITY = _regex.compile(r"\b(?:loss(?:es)?|accuracy|grad\w*|norms?)\b", re.IGNORECASE)
#: An optimizer's settings written as a call ("SGD(lr=0.1, momentum=0.9)", "AdamW(lr=3e-4,
#: wd=0.1)"): the run's configuration stated as context, not a question about the rate.
_OPTIMIZER_SPEC = _regex.compile(
    r"\b[a-z_][\w.]*\s*\((?:[^()\n]|\([^()\n]*\)){0,120}?\blr\s*=(?:[^()\n]|\([^()\n]*\)){0,120}\)",
    re.IGNORECASE,
)
#: A loss said to climb, blow up or diverge: a training problem, whatever the text blames for it
#: (a raised learning rate, a deleted warmup), so the text is no learning-rate-only question.
_LOSS_TROUBLE = _regex.compile(
    r"\bloss(?:es)?\b[^.?!\n]{0,80}?\b(?:climb\w*|blew\s+up|blow(?:s|ing)?\s+up|explod\w*|"
    r"diverg\w*|shot\s+up|shoots\s+up|went\s+back\s+up|goes\s+back\s+up|nan)\b",
    re.IGNORECASE,
)
#: Lightning clipping for you: ``gradient_clip_val`` set to a positive value (automatic
#: optimization clips at the right point, after unscaling, once per accumulated step).
_LIGHTNING_CLIPS = _regex.compile(
    r"\bgradient_clip_val\b\s*[=:]\s*['\"]?(?!0+(?:\.0*)?(?![\d.eE])|none\b)\d*\.?\d",
    re.IGNORECASE,
)
#: Clipping done or wanted by hand, or manual optimization (where Lightning does not clip): the
#: belief that Lightning needs hand-written clipping may still be what the text holds.
_HAND_CLIPPING = _regex.compile(
    r"\bmanual\w*|\bby\s+hand\b|\bmyself\b|\bourselves\b|automatic_optimization|"
    r"clip_grad_(?:norm|value)_?|clip_gradients|on_after_backward|on_before_optimizer_step|"
    r"configure_gradient_clipping",
    re.IGNORECASE,
)
#: What the Lightning clipping belief keeps when the text sets Lightning's own clipping.
_LIGHTNING_CLIPS_KEEP = 0.4
#: Loss readings an LR range test produces by design.
_RANGE_TEST_READINGS = frozenset(
    {"loss-diverging", "loss-spikes", "diverges-after-stable-start", "loss-stuck", "plateau"}
)
#: In-scope words such a question uses in its own sense: the run's checkpoint file, a loader
#: "stuck waiting", the range test's loss flat at first and "blowing up" at its top rates.
_INCIDENTAL_SCOPE: tuple[tuple[re.Pattern[str], frozenset[str]], ...] = (
    (_TOOLING_QUESTION, frozenset({"checkpoint", "stuck"})),
    # A state dict saved from a DDP-wrapped model ("module." keys) is a loading question.
    (_STATE_DICT_KEYS, frozenset({"checkpoint", "ddp"})),
    (_LR_RANGE_TEST, frozenset({"explod", "diverg", "spik", "unst", "nan", "inf", "plateau"})),
)
#: Words that put a question inside the gradient domain (normalised by the analyser at load).
#: Problems and gradient mechanics only: an LR question about "a residual network" stays out.
IN_SCOPE_WORDS = (
    "nan inf exploding vanishing gradient grad clipping accumulation amp ddp norm spike diverge "
    "unstable oom backward zero_grad unscale dead checkpointing stuck plateau overfitting "
    "underfitting"
)
#: Skip (residual) connections are how gradients reach early layers: a question about them is
#: ours ("a residual network" alone, in a learning-rate question, is not).
_CONNECTIONS = _regex.compile(r"\b(?:skip|residual|shortcut)\s+connections?\b", re.IGNORECASE)


@dataclass(frozen=True)
class Match:
    """One knowledge entry that fits the text.

    ``id`` is the catalogue identifier. ``score`` is the relevance, only comparable within one
    result: the BM25F word score (times a kind prior between 0.85 and 1.3, from the form of the
    text), plus up to 6 for the closest title/claim/paraphrase/phrasing and 4 when the text
    names the entry, plus 20 times the confidence (0-1) of each number, code or word-order rule
    that points at the entry (a test checks these numbers against the constants). ``reasons``
    say why it matched.
    """

    id: str
    kind: EntryKind
    score: float
    title: str
    severity: Severity | None = None
    reasons: list[str] = field(default_factory=list)

    def model_dump(self, *, mode: str = "python") -> dict[str, Any]:
        """The match as a dict (``mode`` is accepted for pydantic-style callers)."""
        return {
            "id": self.id,
            "kind": self.kind,
            "score": self.score,
            "title": self.title,
            "severity": self.severity,
            "reasons": list(self.reasons),
        }


@dataclass
class MatchResult:
    """Ranked matches for one text, plus what was read from it.

    * ``matches``: best first.
    * ``out_of_scope`` / ``pointer``: a learning-rate-only or data-only question (the data
      pipeline's speed or hangs and checkpoint resuming included), and where to look instead.
    * ``numbers``: quantities read from the text (loss, grad_norm, dead_fraction, ...); the most
      extreme value when a quantity appears more than once.
    * ``series``: quantities written several times, in order (grad_norm, layer_norms, loss,
      val_loss, perplexity): what the trend rules read; a range counts as its geometric middle.
    * ``code_detected``: whether code rules ran.

    A plain dataclass, not a pydantic model: ``gradient-doctor match`` then never imports
    pydantic (a third of its start-up). ``model_dump`` / ``model_dump_json`` give the same data
    a pydantic model would, NaN and infinities written as the strings "NaN" / "Infinity".
    """

    matches: list[Match] = field(default_factory=list)
    out_of_scope: bool = False
    pointer: str | None = None
    numbers: dict[str, float] = field(default_factory=dict)
    series: dict[str, list[float]] = field(default_factory=dict)
    code_detected: bool = False

    def model_dump(self, *, mode: str = "python") -> dict[str, Any]:
        """The result as plain dicts and lists (``mode`` is accepted for pydantic-style
        callers; numbers stay floats, NaN included, as pydantic's dump keeps them)."""
        return {
            "matches": [m.model_dump(mode=mode) for m in self.matches],
            "out_of_scope": self.out_of_scope,
            "pointer": self.pointer,
            "numbers": dict(self.numbers),
            "series": {name: list(values) for name, values in self.series.items()},
            "code_detected": self.code_detected,
        }

    def model_dump_json(self, *, indent: int | None = None) -> str:
        """The result as JSON; NaN and infinities become "NaN", "Infinity", "-Infinity"."""
        import json  # only for JSON output (the Markdown answer never needs it)

        separators = (",", ": ") if indent is not None else (",", ":")
        return json.dumps(
            _finite_or_named(self.model_dump()),
            indent=indent,
            separators=separators,
            ensure_ascii=False,
        )


def _finite_or_named(value: Any) -> Any:
    """``value`` with every non-finite float replaced by its JSON name (as a string)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: _finite_or_named(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite_or_named(item) for item in value]
    return value


@dataclass
class _Doc:
    entry_id: str
    sentences: list[tuple[str, frozenset[str], float]]
    id_terms: frozenset[str]
    id_sequence: tuple[str, ...] = ()


class _Limit(NamedTuple):
    """One threshold of the profile in use: its value and the seed it comes from."""

    value: float
    seed: str


_LIMITS = (
    "exploding_warning",
    "exploding_critical",
    "vanishing_warning",
    "vanishing_critical",
    "early_late_ratio",
    "layer_spread_warning",
    "layer_spread_critical",
    "zero_grad_fraction_warning",
    "zero_grad_fraction_critical",
    "dead_fraction_warning",
    "dead_fraction_critical",
    "grad_param_ratio_high",
    "grad_param_ratio_low",
    "spike_factor",
)


@dataclass(frozen=True)
class _Profile:
    """The thresholds the number rules use (one profile of ``thresholds.yaml``)."""

    name: str
    healthy_range: tuple[float, float]
    exploding_warning: _Limit
    exploding_critical: _Limit
    vanishing_warning: _Limit
    vanishing_critical: _Limit
    early_late_ratio: _Limit
    layer_spread_warning: _Limit
    layer_spread_critical: _Limit
    zero_grad_fraction_warning: _Limit
    zero_grad_fraction_critical: _Limit
    dead_fraction_warning: _Limit
    dead_fraction_critical: _Limit
    grad_param_ratio_high: _Limit
    grad_param_ratio_low: _Limit
    spike_factor: _Limit

    @classmethod
    def of(cls, kb: KnowledgeBase, name: str | None) -> _Profile:
        profile = kb.thresholds.profile(name)
        limits = {
            key: _Limit(float(getattr(profile, key).value), getattr(profile, key).source.seed)
            for key in _LIMITS
        }
        low, high = kb.thresholds.healthy_range
        return cls(profile.name, (float(low), float(high)), **limits)

    def data(self) -> list[Any]:
        return [self.name, list(self.healthy_range), *(list(getattr(self, k)) for k in _LIMITS)]

    @classmethod
    def from_data(cls, data: list[Any]) -> _Profile:
        name, (low, high), *limits = data
        values = {
            key: _Limit(float(value), str(seed))
            for key, (value, seed) in zip(_LIMITS, limits, strict=True)
        }
        return cls(str(name), (float(low), float(high)), **values)


@dataclass(frozen=True)
class EntryCard:
    """What a match shows of its entry, kept in the index so a match needs no YAML or models."""

    id: str
    kind: EntryKind
    title: str
    severity: Severity | None = None
    pointer: str | None = None
    say_instead: str | None = None
    fix: str | None = None
    first_checks: tuple[str, ...] = ()
    snippets: tuple[str, ...] = ()

    @classmethod
    def of(cls, entry: Entry) -> EntryCard:
        fix = getattr(entry, "fix", None)
        return cls(
            id=entry.id,
            kind=entry.kind,
            title=entry.title,
            severity=getattr(entry, "severity", None),
            pointer=getattr(entry, "pointer", None),
            say_instead=getattr(entry, "say_instead", None),
            fix=fix if isinstance(fix, str) else None,
            first_checks=tuple(getattr(entry, "first_checks", None) or ()),
            snippets=tuple(entry.snippets),
        )


@dataclass
class _Lexical:
    score: float
    contributions: list[tuple[float, str]]
    named: bool
    best_sim: float
    best_sentence: str


def _field_texts(entry: Entry) -> Iterable[tuple[str, list[str]]]:
    yield "title", [entry.title]
    yield "id", [entry.id.replace("-", " ")]
    yield "summary", [entry.summary]
    yield "keywords", list(entry.keywords)
    for name in (
        "claim",
        "paraphrases",
        "phrasings",
        "description",
        "what",
        "why",
        "shows_up",
        "confirm",
        "fix",
        "say_instead",
        "first_checks",
        "seed_correction",
    ):
        value = getattr(entry, name, None)
        if value is None:
            continue
        yield name, [value] if isinstance(value, str) else [str(v) for v in value]


def _bigrams(terms: Sequence[str]) -> list[str]:
    return [f"{a} {b}" for a, b in itertools.pairwise(terms) if a != b]


class Matcher:
    """The index over the knowledge entries (build once, query many times).

    ``Matcher(kb)`` builds the index from a :class:`KnowledgeBase`; :func:`get_matcher` keeps
    the default one, and reuses a snapshot of it across processes (see :func:`snapshot_path`).
    """

    def __init__(self, kb: KnowledgeBase, *, profile: str | None = None) -> None:
        self._kb: KnowledgeBase | None = kb
        self._adopt(_build_index(kb, profile))

    @classmethod
    def from_snapshot(cls, data: dict[str, Any]) -> Matcher:
        """A matcher from :meth:`snapshot` data (no YAML, no knowledge models)."""
        matcher = cls.__new__(cls)
        matcher._kb = None
        matcher._adopt(data)
        return matcher

    def snapshot(self) -> dict[str, Any]:
        """The index as plain data (dicts, lists, strings, numbers) for :mod:`marshal`."""
        return self._data

    @property
    def kb(self) -> KnowledgeBase:
        """The knowledge base behind the index (loaded on first use after a snapshot)."""
        if self._kb is None:
            from gradient_doctor.knowledge.loader import load_knowledge

            self._kb = load_knowledge()
        return self._kb

    def _adopt(self, data: dict[str, Any]) -> None:
        if data.get("format") != _SNAPSHOT_FORMAT:
            raise ValueError("not a matcher snapshot of this version")
        self._data = data
        self.profile = _Profile.from_data(data["profile"])
        words, phrases, related = data["synonyms"]
        self.analyzer = Analyzer(Synonyms.from_tables(phrases, words, related))
        self.docs = [
            _Doc(
                entry_id,
                [(text, frozenset(terms), idf_sum) for text, terms, idf_sum in sentences],
                frozenset(id_terms),
                tuple(id_sequence),
            )
            for entry_id, sentences, id_terms, id_sequence in data["docs"]
        ]
        self.idf: dict[str, float] = data["idf"]
        # Each term's postings stay packed (doubles: entry index, weighted term frequency)
        # until a query uses the term: unpacking all of them is most of a snapshot's load time.
        self._packed_postings: dict[str, bytes] = data["postings"]
        self._postings: dict[str, list[tuple[int, float, float]]] = {}
        self.norms: list[float] = data["norms"]
        # Where each term stands among the entries' sentences (entry index, sentence index),
        # built on the first query: the sentence nearest the query is looked for only among
        # the sentences that share a term with it.
        self._sentence_postings: dict[str, list[tuple[int, int]]] | None = None
        self.typos = TypoCorrector(data["vocabulary"])
        self._default_idf: float = data["default_idf"]
        self.in_scope_terms = frozenset(data["in_scope"])
        self.effects = {k: frozenset(v) for k, v in data["effects"].items()}
        self._id_terms = {doc.entry_id: doc.id_terms for doc in self.docs}
        self.cards = {
            card[0]: EntryCard(
                card[0],
                card[1],
                card[2],
                card[3],
                card[4],
                card[5],
                card[6],
                tuple(card[7]),
                tuple(card[8]),
            )
            for card in data["cards"]
        }

    # -- query side ------------------------------------------------------------------------

    def _query_terms(
        self, text: str
    ) -> tuple[dict[str, float], list[str], dict[str, str], dict[str, str], str]:
        """Term weights, terms in order, typo fixes (raw → fixed), term → surface, fixed text.

        Misspellings are repaired in the text itself before it is analysed, so a repaired word
        can still complete a synonym phrase ("almost no graident" → "almost no gradient").
        """
        fixes: dict[str, str] = {}
        tokens = self.analyzer.tokens(text)
        for token in tokens:
            if token.term in self.idf:
                # A word seen once or twice in the entries may itself be a deliberate typo
                # there ("gradiants"); read it as the common word it stands for.
                if self.typos.counts.get(token.raw, 0) <= 2:
                    common = self.typos.correct(token.raw, rare=True)
                    if common is not None:
                        fixes[token.raw] = common
                continue
            fixed = self.typos.correct(token.raw)
            if fixed is not None:
                fixes[token.raw] = fixed
        repaired_text = _apply_fixes(text, fixes)
        # Nothing repaired: the text's tokens are the repaired text's (no second analysis).
        repaired = tokens if repaired_text is text else self.analyzer.tokens(repaired_text)
        terms = [t.term for t in repaired]
        surface = {t.term: t.raw for t in repaired}
        # Show a rewritten phrase as the user wrote it ("blew up"), not as its canonical token.
        synonyms = self.analyzer.synonyms
        if synonyms.phrase_pattern is not None:
            lowered = normalise(repaired_text)
            for found in synonyms.phrase_pattern.finditer(lowered):
                canonical = synonyms.phrase_to_canonical[found.group(0)]
                for token in self.analyzer.tokens(canonical):
                    if surface.get(token.term) == token.raw and token.raw not in lowered:
                        surface[token.term] = found.group(0)
        weights: dict[str, float] = {}
        for term in terms:
            weights[term] = min(weights.get(term, 0.0) + 1.0, 2.0)
        for term in list(weights):
            for rel in self.analyzer.related(term):
                if rel not in weights:
                    weights[rel] = _RELATED_WEIGHT
        for gram in _bigrams(terms):
            weights[gram] = max(weights.get(gram, 0.0), 1.0)
        return weights, terms, fixes, surface, repaired_text

    def _denied_terms(self, text: str) -> frozenset[str]:
        """The terms of failure words that ``text`` names only under a negation ("it is NOT
        exploding", "no NaN anywhere", "never blew up"); a failure word also said without one
        ("no NaN in the inputs, but the loss is NaN") stays."""
        spans = negated_spans(text)
        if not spans:
            return frozenset()
        negated: set[str] = set()
        rest, last = [], 0
        for start, end in spans:
            negated.update(
                token.term
                for token in self.analyzer.tokens(text[start:end])
                if FAILURE_WORD.match(token.raw)
            )
            rest.append(text[last:start])
            last = end
        if not negated:
            return frozenset()
        rest.append(text[last:])
        said = {token.term for token in self.analyzer.tokens(" ".join(rest))}
        return frozenset(negated - said)

    def _drop_denied(self, lexical: dict[str, _Lexical], denied: frozenset[str]) -> None:
        """Take the denied failure words out of every entry's word score but the healthy
        one's: "it is NOT exploding" is no word for exploding gradients (nor is the name
        it spells), while "no NaN" is what a healthy run says. The number and frame readers
        still read the text as written."""
        docs = {doc.entry_id: doc for doc in self.docs}
        for entry_id, lex in list(lexical.items()):
            if entry_id == "healthy":
                continue
            kept = [
                (part, term)
                for part, term in lex.contributions
                if denied.isdisjoint(term.split(" "))
            ]
            named = lex.named and denied.isdisjoint(docs[entry_id].id_terms)
            if len(kept) == len(lex.contributions) and named == lex.named:
                continue
            removed = sum(part for part, term in lex.contributions) - sum(part for part, _ in kept)
            score = lex.score - removed - (_NAMED_BONUS if lex.named and not named else 0.0)
            if score > 0.0 and kept:
                lexical[entry_id] = replace(lex, score=score, contributions=kept, named=named)
            else:
                del lexical[entry_id]

    def _lexical(self, weights: dict[str, float], terms: Sequence[str]) -> dict[str, _Lexical]:
        """BM25F score, nearest-sentence and naming bonuses of every entry sharing a term."""
        term_set = frozenset(terms)
        idf = self.idf
        default_idf = self._default_idf
        query_idf = sum([idf.get(t, default_idf) for t in term_set])
        # (Plain loops, dict.get and precomputed denominators: this runs over ~80 entries and
        # ~230 postings a query, the matcher's largest share of time.)
        found: dict[int, list[tuple[float, str]]] = {}
        for term, qw in weights.items():
            postings = self._postings_of(term)
            if not postings:
                continue
            factor = qw * idf[term] * (_K1 + 1.0)
            for index, tf, denominator in postings:
                contributions = found.get(index)
                if contributions is None:
                    found[index] = [(factor * tf / denominator, term)]
                else:
                    contributions.append((factor * tf / denominator, term))
        sentence_postings = self._sentence_postings
        if sentence_postings is None:
            # Filled before it is shared: a query in another thread never sees half of it.
            sentence_postings = {}
            for index, doc in enumerate(self.docs):
                for position, (_, sentence_terms, _) in enumerate(doc.sentences):
                    for term in sentence_terms:
                        sentence_postings.setdefault(term, []).append((index, position))
            self._sentence_postings = sentence_postings
        sharing: dict[int, set[int]] = {}
        for term in term_set:
            for index, position in sentence_postings.get(term, ()):
                positions = sharing.get(index)
                if positions is None:
                    sharing[index] = {position}
                else:
                    positions.add(position)
        out: dict[str, _Lexical] = {}
        docs = self.docs
        idf_of = idf.__getitem__
        for index, contributions in found.items():
            doc = docs[index]
            best_sim, best_sentence = 0.0, ""
            shared_positions = sharing.get(index)
            if shared_positions:
                sentences = doc.sentences
                # In the entry's order: the first of equally near sentences is the one shown.
                for position in sorted(shared_positions):
                    sentence, sentence_terms, sentence_idf = sentences[position]
                    shared = term_set & sentence_terms
                    if not shared:
                        continue
                    shared_idf = sum(map(idf_of, shared))
                    sim = shared_idf / (query_idf + sentence_idf - shared_idf or 1.0)
                    if sim > best_sim:
                        best_sim, best_sentence = sim, sentence
            named = len(doc.id_terms) >= 2 and doc.id_terms <= term_set and _names(doc, terms)
            score = sum([part for part, _ in contributions]) + _SENTENCE_BONUS * best_sim
            if named:
                score += _NAMED_BONUS
            if score > 0.0:
                out[doc.entry_id] = _Lexical(score, contributions, named, best_sim, best_sentence)
        return out

    def _soften_code_terms(self, weights: dict[str, float], prose: str, code: str) -> None:
        """Halve the weight of words that appear only in pasted code.

        Code is read by the analyser and the order rules; its identifiers (``optimizer``,
        ``step``, ``loss``, ``backward``) are in nearly every loop and would otherwise outvote
        the sentence that says what went wrong.
        """
        only_code = set(self.analyzer.terms(code)) - set(self.analyzer.terms(prose))
        for term in list(weights):
            if any(part in only_code for part in term.split(" ")):
                weights[term] *= _CODE_TERM_WEIGHT

    def _postings_of(self, term: str) -> list[tuple[int, float, float]] | None:
        """The entries holding ``term``: (entry index, term frequency, BM25 denominator
        tf + the entry's length norm), unpacked on the term's first use."""
        found = self._postings.get(term)
        if found is None:
            packed = self._packed_postings.get(term)
            if packed is None:
                return None
            flat = array("d", packed)
            norms = self.norms
            found = []
            for i in range(0, len(flat), 2):
                index, tf = int(flat[i]), flat[i + 1]
                found.append((index, tf, tf + norms[index]))
            self._postings[term] = found
        return found

    @staticmethod
    def _lexical_reasons(entry_id: str, lex: _Lexical, surface: dict[str, str]) -> list[str]:
        reasons: list[str] = []
        ordered = sorted(lex.contributions, reverse=True)
        # Soft expansions (a related word the text does not contain) are not shown as words.
        words = [surface[t] for _, t in ordered if " " not in t and t in surface][:5]
        phrases = [t for _, t in ordered if " " in t][:3]
        if words:
            reasons.append("words: " + ", ".join(dict.fromkeys(words)))
        if phrases:
            shown = [" ".join(surface.get(p, p) for p in ph.split(" ")) for ph in phrases]
            reasons.append("phrases: " + ", ".join(f"'{p}'" for p in shown))
        if lex.named:
            reasons.append(f"names it: '{entry_id}'")
        if lex.best_sim >= 0.35:
            reasons.append(f"close to: '{lex.best_sentence}' ({lex.best_sim:.2f})")
        return reasons

    # -- numbers -----------------------------------------------------------------------------

    def _cite(self, limit: _Limit) -> str:
        return f"profile {self.profile.name}, from {limit.seed}"

    def _spike_hits(self, reason: str, peak: float) -> list[CodeHit]:
        """Gradient-norm spikes, and exploding gradients as a weaker second when a spike
        passes the exploding threshold."""
        hits = [CodeHit("grad-norm-spikes", 1.0, reason)]
        limit = self.profile.exploding_warning.value
        if peak > limit:
            hits.append(
                CodeHit("exploding-gradients", 0.6, f"a spike reaches {fmt(peak)} > {fmt(limit)}")
            )
        return hits

    def _number_evidence(
        self,
        quantities: Sequence[Quantity],
        series: Sequence[Series],
        text: str,
        progress: _Progress,
    ) -> list[CodeHit]:
        p = self.profile
        out: list[CodeHit] = []
        mentions_grads = bool(re.search(r"\bgrad(?:ient)?s?\b|grad_norm", text, re.IGNORECASE))
        series_hits, covered = self._series_evidence(
            series, progress, occasional=bool(_OCCASIONAL.search(text))
        )
        gap = _accuracy_gap(text)
        if gap is not None:
            out.append(gap)
        idle = self._clip_never_reached(quantities, text)
        if idle is not None:
            out.append(idle)
        pinned = self._pinned_at_max_norm(quantities, series, text)
        if pinned is not None:
            # Every step clipped to max_norm: not a healthy norm, whatever its size.
            series_hits = [h for h in series_hits if h.entry_id != "healthy"]
            series_hits.append(pinned)
            covered.add("grad_norm")
        out.extend(series_hits)
        still_learning = progress.improving
        if (
            still_learning
            and _SMALL_GRADS.search(text)
            and not any(q.name == "grad_norm" for q in quantities)
        ):
            out.append(
                CodeHit(
                    "small-grads-mean-broken",
                    0.6,
                    "text: gradients called small while the loss or metrics still improve",
                )
            )
        norms = [q.value for q in quantities if q.name == "grad_norm"]
        finite_grad_norms = bool(norms) and all(math.isfinite(v) for v in norms)
        for q in quantities:
            v, shown = q.value, fmt(q.value)
            if q.name == "loss" and not math.isfinite(v):
                # "loss: nan" in a log is a measurement; "the loss turns NaN" in a sentence may
                # be the premise of a claim, so it counts for less.
                strength = 1.0 if q.logged else 0.45
                out.append(CodeHit("loss-nan", strength, f"loss {shown}: the loss is not finite"))
                # Gradients given as finite norms are said to be finite ("grad norm 0.8 every
                # step but loss: nan"): their mention is no sign that they are NaN.
                if mentions_grads and not finite_grad_norms:
                    out.append(
                        CodeHit(
                            "nan-gradients",
                            strength * 0.8,
                            f"loss {shown} and gradients are mentioned",
                        )
                    )
            elif q.name in ("grad_norm", "grad_nan") and not math.isfinite(v):
                target = (
                    "inf-gradients"
                    if math.isinf(v) or "inf" in q.text.lower()
                    else ("nan-gradients")
                )
                out.append(CodeHit(target, 1.0, f"gradients {shown} ({q.text!r})"))
            elif q.name == "param_nan":
                out.append(CodeHit("nan-parameters", 0.8, f"parameters non-finite ({q.text!r})"))
            elif q.name == "grad_norm":
                if "grad_norm" not in covered:
                    out.extend(
                        self._norm_evidence(v, shown, still_learning, steady=progress.holds_level)
                    )
            elif q.name == "amp_scale_to":
                start = next(
                    (
                        x.value
                        for x in quantities
                        if x.name == "amp_scale_from" and x.text == q.text
                    ),
                    None,
                )
                if start is not None and start > 0 and v < start / 4:
                    out.append(
                        CodeHit(
                            "amp-overflow-skips",
                            1.0,
                            f"loss scale {fmt(start)} → {shown}: GradScaler keeps halving it "
                            "(overflowing steps are skipped)",
                        )
                    )
                elif start is not None and start > 0 and v >= _AMP_SCALE_STEADY:
                    # One or two halvings to a scale still in the thousands: GradScaler
                    # finding its level, as it does in the first steps of any fp16 run.
                    out.append(
                        CodeHit(
                            "healthy",
                            0.5,
                            f"loss scale {fmt(start)} → {shown} and no lower than "
                            f"{fmt(_AMP_SCALE_STEADY)}: GradScaler calibrating, not collapsing",
                        )
                    )
            elif q.name == "amp_scale_level":
                falls = any(x.name == "amp_scale_to" for x in quantities)
                if v >= _AMP_SCALE_STEADY and not falls:
                    out.append(
                        CodeHit(
                            "healthy",
                            0.5,
                            f"loss scale holds at {shown} (≥ {fmt(_AMP_SCALE_STEADY)}): GradScaler "
                            "meets few overflows; a skipped step now and then is how it calibrates",
                        )
                    )
                elif v < _AMP_SCALE_COLLAPSED:
                    out.append(
                        CodeHit(
                            "amp-overflow-skips",
                            0.8,
                            f"loss scale down at {shown}: GradScaler has halved it on overflow "
                            "after overflow",
                        )
                    )
            elif q.name in ("dead_fraction", "zero_activation_fraction"):
                pct = f"{v:.0%}"
                for level, limit in (
                    ("critical", p.dead_fraction_critical),
                    ("warning", p.dead_fraction_warning),
                ):
                    if v > limit.value:
                        reason = f"{pct} > {limit.value:.0%} ({level}, {self._cite(limit)})"
                        strength = 1.0 if level == "critical" else 0.8
                        zeros_first = q.name == "zero_activation_fraction" and v > 0.5
                        if zeros_first or v > 0.5:
                            # Read from "dead" / "never fire": units dead over many inputs is
                            # the signal; the symptom (zeros on one batch) comes second.
                            out.append(
                                CodeHit(
                                    "many-zero-activations",
                                    strength * (1.0 if zeros_first else 0.6),
                                    "zero activations " + reason,
                                )
                            )
                        out.append(
                            CodeHit(
                                "dead-neurons",
                                strength * (0.9 if zeros_first else 1.0),
                                "dead units " + reason,
                            )
                        )
                        break
            elif q.name == "zero_grad_fraction":
                for level, limit in (
                    ("critical", p.zero_grad_fraction_critical),
                    ("warning", p.zero_grad_fraction_warning),
                ):
                    if v > limit.value:
                        out.append(
                            CodeHit(
                                "zero-gradients",
                                1.0 if level == "critical" else 0.8,
                                f"zero-gradient parameters {v:.0%} > {limit.value:.0%} "
                                f"({level}, {self._cite(limit)})",
                            )
                        )
                        break
            elif q.name == "max_norm" and 0 < v < 0.1:
                # Advice to set it ("clip harder, max_norm=0.01") is the rationalization;
                # a report of it is the red flag.
                out.append(
                    CodeHit(
                        "clip-too-aggressive",
                        0.9,
                        f"max_norm {shown} < 0.1 (GM pitfall 10)",
                        advice_id="clip-harder",
                    )
                )
            elif q.name == "grad_param_ratio":
                if v > p.grad_param_ratio_high.value:
                    out.append(
                        CodeHit(
                            "grad-param-ratio",
                            1.0,
                            f"grad/param ratio {shown} > {fmt(p.grad_param_ratio_high.value)} "
                            f"(warning, {self._cite(p.grad_param_ratio_high)})",
                        )
                    )
                elif 0 < v < p.grad_param_ratio_low.value:
                    out.append(
                        CodeHit(
                            "grad-param-ratio",
                            1.0,
                            f"grad/param ratio {shown} < {fmt(p.grad_param_ratio_low.value)} "
                            f"(warning, {self._cite(p.grad_param_ratio_low)})",
                        )
                    )
                elif v > 0:
                    out.append(
                        CodeHit(
                            "healthy",
                            0.5,
                            f"grad/param ratio {shown} is inside "
                            f"{fmt(p.grad_param_ratio_low.value)}–"
                            f"{fmt(p.grad_param_ratio_high.value)} "
                            f"({self._cite(p.grad_param_ratio_high)})",
                        )
                    )
            elif q.name == "update_ratio" and v > 0:
                usual = _UPDATE_RATIO_USUAL
                near = _USUAL_ORDER_FACTOR
                if usual * near < v <= usual * _UPDATE_RATIO_FACTOR or (
                    usual / _UPDATE_RATIO_FACTOR <= v < usual / near
                ):
                    # Outside its usual order but short of two orders away: worth a look,
                    # never healthy.
                    out.append(
                        CodeHit(
                            "update-param-ratio",
                            0.6,
                            f"update/weight ratio {shown} is more than {fmt(near)}× away from "
                            f"its usual ~{fmt(usual)} (the entry's own line)",
                        )
                    )
                elif v > usual * _UPDATE_RATIO_FACTOR or v < usual / _UPDATE_RATIO_FACTOR:
                    side = "above" if v > usual else "below"
                    out.append(
                        CodeHit(
                            "update-param-ratio",
                            1.0,
                            f"update/weight ratio {shown} is {fmt(_UPDATE_RATIO_FACTOR)}× or more "
                            f"{side} its usual ~{fmt(usual)} (the entry's own line)",
                        )
                    )
                else:
                    out.append(
                        CodeHit(
                            "healthy",
                            0.5,
                            f"update/weight ratio {shown} is within {fmt(near)}× "
                            f"of its usual ~{fmt(usual)} (the update-param-ratio entry's own line)",
                        )
                    )
            elif q.name == "layer_ratio":
                out.extend(self._layer_spread(v, shown))
        return self._healthy(out, progress)

    def _says_order_words(self, entry_id: str, lowered: str) -> bool:
        """Whether the text has the id's words the analyser drops ("after", "before", "per").

        clip-after-step is named by "clip after the step", not by "clip_grad_norm_ returns
        400 every step": without them an id's remaining words say nothing of the order.
        """
        dropped = [w for w in entry_id.split("-") if w.isalpha() and not self.analyzer.terms(w)]
        return all(re.search(rf"\b{word}\b", lowered) for word in dropped)

    def _opposite_size(self, quantities: Sequence[Quantity]) -> frozenset[str]:
        """The entries that the gradient norms the text gives rule out by their size."""
        norms = [q.value for q in quantities if q.name == "grad_norm"]
        if norms and min(norms) > self.profile.exploding_warning.value:
            return _SMALL_GRADIENT_ENTRIES
        if norms and max(norms) < self.profile.vanishing_warning.value:
            return _LARGE_GRADIENT_ENTRIES
        return frozenset()

    def _contradicted(self, quantities: Sequence[Quantity]) -> set[str]:
        """Signals whose defining number the text gives, and gives inside its normal band.

        "grad/param ratio around 1e-3 for every layer" shares every word with the
        grad-param-ratio entry, yet its number says that signal is absent.
        """
        p = self.profile
        values: dict[str, list[float]] = {}
        for q in quantities:
            values.setdefault(q.name, []).append(q.value)
        out: set[str] = set()
        ratios = values.get("grad_param_ratio", [])
        low, high = p.grad_param_ratio_low.value, p.grad_param_ratio_high.value
        updates = values.get("update_ratio", [])
        usual, factor = _UPDATE_RATIO_USUAL, _UPDATE_RATIO_FACTOR
        if (ratios or updates) and (
            all(low <= v <= high for v in ratios)
            and all(usual / factor <= v <= usual * factor for v in updates)
        ):
            # One ratio (gradient or update against the weights), inside its band: the text
            # reports neither ratio signal (the two entries share nearly every word).
            out |= {"grad-param-ratio", "update-param-ratio"}
        dead = values.get("dead_fraction", []) + values.get("zero_activation_fraction", [])
        if dead and max(dead) <= p.dead_fraction_warning.value:
            # "3% of units never activate": a few dead units are normal in a ReLU net; the
            # entries are about a large share of them.
            out |= {"dead-neurons", "many-zero-activations"}
        levels = values.get("amp_scale_level", [])
        if levels and min(levels) >= _AMP_SCALE_STEADY and "amp_scale_to" not in values:
            # The entry is a scale that keeps falling: not one said to hold high.
            out.add("amp-overflow-skips")
        falls = list(
            zip(values.get("amp_scale_from", []), values.get("amp_scale_to", []), strict=False)
        )
        if falls and all(to >= _AMP_SCALE_STEADY and to >= start / 4 for start, to in falls):
            # "dropped 65536 -> 32768 in the first steps": one halving, still in the thousands.
            out.add("amp-overflow-skips")
        return out

    def _layer_spread(self, ratio: float, shown: str) -> list[CodeHit]:
        """Per-layer norms ``ratio``× apart: a spread (GS), and vanishing when very far apart."""
        p = self.profile
        out: list[CodeHit] = []
        if ratio > p.early_late_ratio.value:
            out.append(
                CodeHit(
                    "vanishing-gradients",
                    0.8,
                    f"layers differ {shown}× > {fmt(p.early_late_ratio.value)}× "
                    f"({self._cite(p.early_late_ratio)})",
                )
            )
        for level, limit in (
            ("critical", p.layer_spread_critical),
            ("warning", p.layer_spread_warning),
        ):
            if ratio > limit.value:
                out.append(
                    CodeHit(
                        "layer-norm-spread",
                        0.9 if level == "critical" else 0.7,
                        f"per-layer norms differ {shown}× > {fmt(limit.value)}× "
                        f"({level}, {self._cite(limit)})",
                    )
                )
                break
        return out

    def _scale_series(self, item: Series) -> list[CodeHit]:
        """A GradScaler scale printed step by step: halving run after run is overflow skips."""
        values = item.values
        if len(values) < 2 or values[0] <= 0:
            return []
        falling = all(b <= a for a, b in itertools.pairwise(values))
        if falling and values[-1] < values[0] / 4:
            return [
                CodeHit(
                    "amp-overflow-skips",
                    1.0,
                    f"loss scale {fmt(values[0])} → {fmt(values[-1])} row after row: GradScaler "
                    "keeps halving it (overflowing steps are skipped)",
                )
            ]
        return []

    def _layer_norms(self, item: Series) -> list[CodeHit]:
        """Norms listed layer by layer: their spread, or balanced layers (healthy)."""
        p = self.profile
        values = [v for v in item.values if v > 0]
        values += [x for pair in item.ranges for x in pair if x > 0]
        if len(values) < 2:
            return []
        low, high = min(values), max(values)
        if high < p.vanishing_warning.value:
            return self._norm_evidence(high, fmt(high), False)
        spread = high / low
        hits = self._layer_spread(spread, fmt(spread))
        listed = [v for v in item.values if v > 0]
        if (
            len(listed) >= 3
            and not item.ranges
            and abs(rank_correlation(listed)) >= _LAYER_ORDER_CORRELATION
        ):
            # Norms that shrink layer after layer in the order listed (the input's side at one
            # end): the gradient fades through depth, which the spread only measures.
            fades = any(h.entry_id == "vanishing-gradients" for h in hits)
            hits = [
                CodeHit(h.entry_id, 1.0, h.reason + "; the norms shrink steadily through depth")
                if h.entry_id == "vanishing-gradients"
                else CodeHit(h.entry_id, min(h.strength, 0.5), h.reason)
                if fades
                else h
                for h in hits
            ]
        if hits:
            return hits
        return [
            CodeHit(
                "healthy",
                0.6,
                f"per-layer norms {fmt(low)}–{fmt(high)} are within "
                f"{fmt(p.layer_spread_warning.value)}× of each other: the layers are balanced "
                f"({self._cite(p.layer_spread_warning)})",
            )
        ]

    def _healthy(self, hits: list[CodeHit], progress: _Progress) -> list[CodeHit]:
        """One ``healthy`` hit, surer when training improves and the text asks if it is normal.

        Healthy numbers next to a number that shows a problem (a NaN loss, a spike) stay weak.
        """
        healthy = [h for h in hits if h.entry_id == "healthy"]
        if not healthy:
            return hits
        rest = [h for h in hits if h.entry_id != "healthy"]
        best = max(healthy, key=lambda h: h.strength)
        if any(h.strength >= 0.8 for h in rest):
            return [*rest, best]
        strength, reason = best.strength, best.reason
        if progress.improving:
            strength += 0.3
            reason += "; training improves"
        if progress.normal_question:
            strength += 0.5
            reason += "; the question is whether this is normal"
        return [*rest, CodeHit("healthy", strength, reason)]

    def _norm_evidence(
        self, v: float, shown: str, still_learning: bool, *, steady: bool = False
    ) -> list[CodeHit]:
        p = self.profile
        out: list[CodeHit] = []
        for level, limit in (("critical", p.exploding_critical), ("warning", p.exploding_warning)):
            if v > limit.value:
                out.append(
                    CodeHit(
                        "exploding-gradients",
                        1.0 if level == "critical" else 0.85,
                        f"grad norm {shown} > {fmt(limit.value)} ({level}, {self._cite(limit)})",
                    )
                )
                return out
        if v == 0.0:
            # CG: a norm of exactly zero means nothing flows back (frozen, dead, disconnected).
            out.append(CodeHit("zero-gradients", 1.0, "grad norm exactly 0: nothing flows back"))
            out.append(CodeHit("vanishing-gradients", 0.7, "grad norm exactly 0"))
            return out
        for level, limit in (
            ("critical", p.vanishing_critical),
            ("warning", p.vanishing_warning),
        ):
            if v < limit.value:
                reason = f"grad norm {shown} < {fmt(limit.value)} ({level}, {self._cite(limit)})"
                if still_learning:
                    out.append(
                        CodeHit(
                            "small-grads-mean-broken",
                            1.1,
                            reason + " but the text says training still improves",
                        )
                    )
                    out.append(CodeHit("vanishing-gradients", 0.6, reason))
                else:
                    out.append(
                        CodeHit("vanishing-gradients", 1.0 if level == "critical" else 0.85, reason)
                    )
                return out
        low, high = self.profile.healthy_range
        if low <= v <= high:
            # A level said to hold ("flat at ~0.4 for 50k steps") is more than one reading.
            out.append(
                CodeHit(
                    "healthy",
                    0.5 if steady else 0.3,
                    f"grad norm {shown} inside the healthy range {fmt(low)}–{fmt(high)}"
                    + (", and said to hold there" if steady else ""),
                )
            )
        elif v < low and still_learning:
            # Below the usual range but far from vanishing, while training improves: the size
            # of the norm alone says nothing is broken (the rationalization to answer).
            out.append(
                CodeHit(
                    "small-grads-mean-broken",
                    1.0,
                    f"grad norm {shown} is below the usual {fmt(low)}–{fmt(high)} but not near "
                    f"vanishing (< {fmt(p.vanishing_warning.value)}), and the text says "
                    "training still improves",
                )
            )
        return out

    def _clip_never_reached(self, quantities: Sequence[Quantity], text: str) -> CodeHit | None:
        """max_norm far above the most the norm ever reaches, while the run is unstable."""
        clip = next((q.value for q in quantities if q.name == "max_norm" and q.value > 0), None)
        ceiling = [q.value for q in quantities if q.name == "grad_norm_ceiling"]
        # "never crossed 100" under max_norm 100: a norm at most max_norm is never clipped.
        if clip is None or not ceiling or max(ceiling) > clip or not _UNSTABLE.search(text):
            return None
        return CodeHit(
            "clip-never-active",
            0.9,
            f"the norm never exceeds {fmt(max(ceiling))}, under max_norm {fmt(clip)}: the clip "
            "never fires while the run is unstable",
        )

    def _pinned_at_max_norm(
        self, quantities: Sequence[Quantity], series: Sequence[Series], text: str
    ) -> CodeHit | None:
        """The logged grad norm equals max_norm on every step: clipping is always active."""
        clip = next((q.value for q in quantities if q.name == "max_norm" and q.value > 0), None)
        if clip is None:
            return None
        norms = next((s.values for s in series if s.name == "grad_norm"), None)
        if norms is not None and len(norms) >= 3:
            pinned = all(abs(v - clip) <= 0.02 * clip for v in norms)
        else:
            single = [q.value for q in quantities if q.name == "grad_norm"]
            pinned = (
                len(single) == 1
                and abs(single[0] - clip) <= 0.02 * clip
                and bool(_EVERY_STEP.search(text))
            )
        if not pinned:
            return None
        return CodeHit(
            "clipping-slow-convergence",
            1.0,
            f"the grad norm reads max_norm ({fmt(clip)}) on every step: every update is clipped",
        )

    # -- number series -------------------------------------------------------------------------

    def _series_evidence(
        self, series: Sequence[Series], progress: _Progress, *, occasional: bool = False
    ) -> tuple[list[CodeHit], set[str]]:
        """Hits from quantities written as series, and the names whose trend was read.

        A grad-norm series that shows a trend, spikes or a level replaces the one-number
        rules for the grad norm (its first value alone would mislead: "~800 at first, then
        settles around 1-2" is not exploding).
        """
        out: list[CodeHit] = []
        covered: set[str] = set()
        train_loss = next((s for s in series if s.name == "loss"), None)
        if train_loss is not None and _decreasing(train_loss.values):
            progress.improving = True
            progress.reasons.append("the loss series falls")
        for item in series:
            if item.name == "grad_norm" and len(item.values) == 2 and progress.layer_pair:
                # "the first layer's norm is 3e-9 while the last layer's is 1e-2": two layers
                # side by side, not the total norm at two times.
                early, late = item.values if progress.early_layer_first else item.values[::-1]
                for hit in self._layer_norms(item):
                    if hit.entry_id == "vanishing-gradients":
                        if early >= late:
                            continue  # the early layer is the large one: a spread only
                        hit = CodeHit(
                            hit.entry_id, 1.0, hit.reason + "; the early layer is the small one"
                        )
                    out.append(hit)
                covered.add(item.name)
            elif item.name == "grad_norm":
                hits = self._norm_series(item, occasional=occasional)
                if not hits and len(item.values) == 1:
                    # One level or range ("hovers around 0.05-0.08"): the one-number rules.
                    level = item.values[0]
                    hits = self._norm_evidence(level, fmt(level), progress.improving)
                if hits:
                    covered.add(item.name)
                out.extend(hits)
            elif item.name == "layer_norms":
                out.extend(self._layer_norms(item))
            elif item.name == "amp_scale":
                out.extend(self._scale_series(item))
            else:
                out.extend(self._loss_series(item, progress))
        return out, covered

    def _norm_series(self, item: Series, *, occasional: bool = False) -> list[CodeHit]:
        p = self.profile
        low, high = self.profile.healthy_range
        values = list(item.values)
        n = len(values)
        shown = _shown(values)
        factor = p.spike_factor.value
        if (
            n >= 2
            and occasional
            and values[0] > 0
            and all(v > factor * values[0] for v in values[1:])
        ):
            # "~1 except at a few steps where it hits 400": a level and its exceptions.
            return [
                CodeHit(
                    "grad-norm-spikes",
                    0.9,
                    f"grad norm {fmt(values[0])} most of the time, {fmt(values[1])} on some "
                    f"steps: above {fmt(factor)}× its usual level (spike factor, "
                    f"{self._cite(p.spike_factor)})",
                )
            ]
        if n >= 4:
            spikes = _isolated_spikes(values, factor)
            if spikes:
                median = _median(v for i, v in enumerate(values) if i not in spikes)
                return self._spike_hits(
                    f"grad norm {shown}: {len(spikes)} isolated value(s) above "
                    f"{fmt(factor)}× the median {fmt(median)} (spike factor, "
                    f"{self._cite(p.spike_factor)})",
                    max(values[i] for i in spikes),
                )
        first, last = values[0], values[-1]
        if n >= 3 and min(first, last) > 0 and max(first, last) < factor * min(first, last):
            # "sits at 0.6-1.1, step 3412 hit 94 and step 7730 210, then back to 0.9": a usual
            # level, a run of readings far above it, and a return to it is an excursion (the
            # spikes' shape), whatever the number of readings inside the run.
            level = max(first, last)
            inside = values[1:-1]
            if all(v > factor * level for v in inside):
                return self._spike_hits(
                    f"grad norm {shown}: {len(inside)} reading(s) above {fmt(factor)}× its "
                    f"usual level {fmt(level)}, then back to it (spike factor, "
                    f"{self._cite(p.spike_factor)})",
                    max(inside),
                )
        correlation = rank_correlation(values)
        if n >= 3 and first > 0 and last / first > 10 and correlation >= 0.8:
            hits = [
                CodeHit(
                    "grad-norm-rising",
                    # Past the exploding threshold the size itself is the diagnosis; the
                    # trend is the secondary reading.
                    0.7 if last > p.exploding_critical.value else 1.0,
                    f"grad norm {shown}: rises {fmt(last / first)}× step after step",
                )
            ]
            if last > p.exploding_warning.value:
                hits.extend(self._norm_evidence(last, fmt(last), False))
            return hits
        if last > 0 and first / last > 100 and last < low and (n == 2 or correlation <= -0.8):
            hits = [
                CodeHit(
                    "grad-norm-decaying",
                    1.0,
                    f"grad norm {shown}: decays {fmt(first / last)}× towards zero",
                )
            ]
            if last < p.vanishing_warning.value:
                hits.extend(self._norm_evidence(last, fmt(last), False))
            return hits
        if (
            n >= 4
            and first > 0
            and last / first >= _STEADY_RISE_FACTOR
            and all(b > a for a, b in itertools.pairwise(values))
        ):
            # "0.8 at 1k, 1.5 at 5k, 3 at 10k, 6 at 20k": every reading above the one before,
            # several times the first. Still inside the healthy band, but the trend is what
            # grad-norm-rising describes; weaker than a rise past the probe's 10×. Past the
            # exploding threshold, the size is the diagnosis, as for the steeper rise above.
            hits = [
                CodeHit(
                    "grad-norm-rising",
                    0.7 if last > p.exploding_critical.value else 0.8,
                    f"grad norm {shown}: every value above the last, {fmt(last / first)}× "
                    "overall (a steady climb)",
                )
            ]
            if last > p.exploding_warning.value:
                hits.extend(self._norm_evidence(last, fmt(last), False))
            return hits
        if (
            n >= 2
            and not occasional
            and first > 0
            and last > p.exploding_warning.value
            and last > factor * max(values[:-1])
        ):
            # "used to hover around 2; since this morning it sits between 3,000 and 9,000":
            # the norm moved to a level past the exploding threshold and is told as staying
            # there, not as an exception to its usual level.
            return self._norm_evidence(last, fmt(last), False)
        if n >= 2 and min(values) > p.exploding_warning.value:
            # "1.2e4, 8.9e3, 2.1e4 from the very first steps": every reading far past the
            # exploding threshold, with no trend to read; the size is the finding.
            return self._norm_evidence(_median(values), fmt(_median(values)), False)
        within = all(low <= v <= high for v in values) and all(
            low <= a and b <= high for a, b in item.ranges
        )
        if within:
            return [
                CodeHit(
                    "healthy",
                    0.6,
                    f"grad norm {shown} stays inside the healthy range {fmt(low)}–{fmt(high)}",
                )
            ]
        if first > high and low <= last <= high and correlation < 0:
            return [
                CodeHit(
                    "healthy",
                    0.6,
                    f"grad norm {fmt(first)} at first, then settles at {fmt(last)}, inside the "
                    f"healthy range {fmt(low)}–{fmt(high)}: a large norm in the first steps "
                    "that settles is normal",
                )
            ]
        return []

    def _loss_series(self, item: Series, progress: _Progress) -> list[CodeHit]:
        values = list(item.values)
        n = len(values)
        shown = _shown(values)
        name = {"val_loss": "validation loss", "perplexity": "perplexity"}.get(item.name, "loss")
        if (
            n == 2
            and min(values) > 0
            and progress.same_again
            and not progress.improving
            and max(values) - min(values) <= _LOSS_FLAT_FRACTION * max(values)
        ):
            # "4.6 at step 0 and still 4.6 at step 20k": the words say the loss has not moved.
            return [CodeHit("loss-stuck", 0.7, f"{name} {shown}: the same value again, later")]
        if (
            item.name != "val_loss"
            and n == 2
            and not progress.comes_back
            and min(values) > 0
            and values[1] >= _LOSS_DIVERGING_FACTOR * values[0]
        ):
            # "loss climbs from a best of 2.1 to 9.5": two readings, far apart upwards.
            return [
                CodeHit(
                    "loss-diverging",
                    0.8,
                    f"{name} {shown}: ends at {fmt(values[1] / values[0])}× where it was",
                )
            ]
        if (
            item.name == "val_loss"
            and n >= 2
            and min(values) > 0
            and values[-1] >= _HELD_OUT_RISE_FACTOR * values[0]
            and all(b >= a for a, b in itertools.pairwise(values))
        ):
            # "val loss went from 0.6 at epoch 5 to 1.4 at epoch 30" (or "0.61, 0.74, 0.98"
            # epoch after epoch): held-out results worsen.
            return [CodeHit("overfitting", 0.7, f"{name} {shown} goes up")]
        if n < 3 or min(values) <= 0:
            return []
        for i in range(1, n - 1):
            before, value, after = values[i - 1], values[i], values[i + 1]
            # A jump from the reading before and a return right after ("3.4, 6.9, 3.6").
            if value > _LOSS_SPIKE_FACTOR * before and after < 1.3 * before:
                return [
                    CodeHit(
                        "loss-spikes",
                        0.9,
                        f"{name} {shown}: jumps to {fmt(value)}, "
                        f"{fmt(value / max(before, after))}× its neighbours, and comes back",
                    )
                ]
        best_index = min(range(n), key=lambda i: values[i])
        best, last = values[best_index], values[-1]
        if (
            progress.accumulating
            and item.name == "loss"
            and 0 < best_index < n - 1
            and last >= _HELD_OUT_RISE_FACTOR * best
        ):
            # With accumulation, a loss that falls and then climbs back is that symptom (its
            # usual cause: the accumulation bookkeeping), more than a plain divergence.
            return [
                CodeHit(
                    "loss-down-then-up-with-accumulation",
                    0.9,
                    f"{name} {shown}: falls to {fmt(best)}, then climbs back, with accumulation",
                )
            ]
        if (
            best_index < n - 1
            and last >= _LOSS_DIVERGING_FACTOR * best
            and last >= 0.8 * max(values[best_index:])
        ):
            if item.name == "val_loss" and progress.improving:
                return [
                    CodeHit(
                        "overfitting",
                        0.8,
                        f"{name} {shown} climbs while the training loss improves",
                    )
                ]
            return [
                CodeHit(
                    "loss-diverging",
                    1.0,
                    f"{name} {shown}: ends at {fmt(last / best)}× its best value {fmt(best)} "
                    "and keeps climbing",
                )
            ]
        climb = values[best_index:]
        if (
            item.name != "val_loss"
            and len(climb) >= 4
            and last >= _LOSS_CLIMB_FACTOR * best
            and all(b > a for a, b in itertools.pairwise(climb))
        ):
            # "7.4, 6.9, 9.0, 11.7, 15.2": after its best the loss rises at every reading,
            # already twice its best: diverging, even before it reaches the 3× above.
            return [
                CodeHit(
                    "loss-diverging",
                    0.9,
                    f"{name} {shown}: climbs at every reading since its best {fmt(best)}, now "
                    f"{fmt(last / best)}×",
                )
            ]
        if (
            item.name == "loss"
            and progress.keeps_rising
            and not progress.comes_back
            and len(climb) >= 3
            and last >= _HELD_OUT_RISE_FACTOR * best
            and all(b > a for a, b in itertools.pairwise(climb))
        ):
            # "down to 6.9 by step 600, then it climbs back: 8.8, 9.7, still rising": after
            # its best the loss rises at every reading and the words say it goes on rising.
            return [
                CodeHit(
                    "loss-diverging",
                    0.9,
                    f"{name} {shown}: climbs at every reading since its best {fmt(best)} "
                    "and is said to keep rising",
                )
            ]
        if item.name == "val_loss" and progress.improving and last > 1.1 * best < last:
            return [
                CodeHit("overfitting", 0.8, f"{name} {shown} rises while the training improves")
            ]
        last_two = values[-2:]
        if (
            n == 3
            and progress.holds_level
            and max(last_two) - min(last_two) <= _LOSS_FLAT_FRACTION * max(last_two)
            and values[0] >= 1.15 * max(last_two)
        ):
            # "drops from 5 to 2.5, then sits at 2.5": three values, the words say it stays.
            return [CodeHit("plateau", 0.6, f"{name} {shown}: fell, then stays at one level")]
        tail = values[-3:]
        if (max(tail) - min(tail)) <= _LOSS_FLAT_FRACTION * max(tail):
            if n >= 4 and values[0] >= 1.15 * _median(tail):
                return [CodeHit("plateau", 0.7, f"{name} {shown}: fell, then stays flat")]
            if (max(values) - min(values)) <= _LOSS_FLAT_FRACTION * max(values):
                return [
                    CodeHit(
                        "loss-stuck",
                        0.8,
                        f"{name} {shown}: flat within {_LOSS_FLAT_FRACTION:.0%} from the start",
                    )
                ]
        return []

    # -- causes ------------------------------------------------------------------------------

    def _put_causes_first(
        self,
        scores: dict[str, float],
        reasons: dict[str, list[str]],
        named: set[str],
        measured: frozenset[str] | set[str] = frozenset(),
    ) -> None:
        """A red flag the text describes ranks above the symptoms and signals it explains.

        "No gradient reaches the early layers of my 40-layer sigmoid net" names both the
        observation (vanishing gradients) and its cause; the cause is the answer, since its
        entry carries the fix, and the observation stays next in line.
        """
        for cause in sorted(named & self.effects.keys(), key=lambda c: -scores.get(c, 0.0)):
            own = scores.get(cause)
            if own is None:
                continue
            above = [e for e in self.effects[cause] if scores.get(e, 0.0) >= own]
            if not above:
                continue
            effect = max(above, key=lambda e: scores[e])
            scores[cause] = scores[effect] + 1.0
            how = "measured in the text" if cause in measured else "named"
            reasons.setdefault(cause, []).append(
                f"{how} as the cause of what the text describes ({effect})"
            )

    def _put_severe_first(self, scores: dict[str, float], flagged: set[str]) -> None:
        """Of several mistakes found in the same code, the most serious ranks first.

        A fragment that clips after ``optimizer.step()`` with ``clip_grad_value_`` has two red
        flags; the critical one (the clip does nothing) comes before the info one.
        """
        order = sorted(
            (f for f in flagged if f in scores),
            key=lambda f: (-_SEVERITY_RANK.get(self.cards[f].severity or "info", 0), -scores[f]),
        )
        for more, less in itertools.pairwise(order):
            if scores[more] <= scores[less] and _SEVERITY_RANK.get(
                self.cards[more].severity or "info", 0
            ) > _SEVERITY_RANK.get(self.cards[less].severity or "info", 0):
                scores[more] = scores[less] + 0.5
        # A lift can reorder entries of one severity against the next: settle in one more pass.
        for more, less in itertools.pairwise(order):
            if scores[more] < scores[less]:
                scores[more] = scores[less] + 0.5

    def _put_code_findings_first(
        self,
        scores: dict[str, float],
        reasons: dict[str, list[str]],
        found: set[str],
        unless: Iterable[str] = (),
        why: str = "found in the code shown",
    ) -> None:
        """A serious mistake found in the user's code ranks above every rationalization.

        A rationalization answers someone making a claim; a pasted loop with a problem report
        is not one, however many of the claim's words it shares ("manual optimization in
        Lightning ... clip_grad_norm_" is about the clip, not about who must clip).
        """
        serious = [
            f
            for f in found
            if f in scores and _SEVERITY_RANK.get(self.cards[f].severity or "info", 0) >= 1
        ]
        if not serious:
            return
        skipped = set(unless)
        top_claim = max(
            (
                v
                for k, v in scores.items()
                if self.cards[k].kind == "rationalization" and k not in skipped
            ),
            default=None,
        )
        best = max(serious, key=lambda f: scores[f])
        if top_claim is not None and scores[best] <= top_claim:
            scores[best] = top_claim + 0.5
            reasons.setdefault(best, []).append(why)

    def _put_code_red_flag_first(
        self, scores: dict[str, float], reasons: dict[str, list[str]], found: set[str]
    ) -> None:
        """A serious mistake the analyser finds in the pasted code ranks above everything else.

        The text around a pasted loop tells what the user saw ("loss still spikes", "NaN at
        step 4k", "grad norm reads 0"); a critical or warning red flag in the code is the cause
        of what they saw, and its entry carries the fix. The symptom, the whole-script notes
        (no monitoring, leftover batches) and the claims its words resemble come after it.
        """
        serious = [
            f
            for f in found
            if f in scores
            and self.cards[f].kind == "red-flag"
            and _SEVERITY_RANK.get(self.cards[f].severity or "info", 0) >= 1
        ]
        if not serious:
            return
        best = max(serious, key=lambda f: scores[f])
        others = max((v for k, v in scores.items() if k not in serious), default=None)
        if others is not None and scores[best] <= others:
            scores[best] = others + 0.5
            reasons.setdefault(best, []).append(
                "a mistake in the code shown: the likely cause of what the text describes"
            )

    def _put_clean_step_first(
        self, scores: dict[str, float], reasons: dict[str, list[str]]
    ) -> None:
        """A training step the analyser reads whole and finds nothing wrong with is healthy.

        Someone pasting a correct AMP step ("scale, backward, unscale_, clip, step, update")
        and asking for a check shares every word with the AMP red flags and claims; what the
        analyser found (nothing) is the answer, and ``healthy`` says why.
        """
        if "healthy" not in self.cards:
            return
        top = max(scores.values(), default=0.0)
        if scores.get("healthy", 0.0) <= top:
            scores["healthy"] = top + 0.5
        reasons.setdefault("healthy", []).insert(
            0,
            "code: the static analyser reads the step shown (backward, clip, step) and finds no "
            "mistake in its calls or their order; the text asks for a check, not about a failure",
        )

    # -- scope ---------------------------------------------------------------------------------

    def _in_scope(self, text: str, terms: Iterable[str]) -> bool:
        """Whether the text uses a gradient-domain word in its gradient sense, or says the loss
        climbs, blows up or diverges (outside an LR range test, where that is how it ends)."""
        if _LOSS_TROUBLE.search(text) and not _LR_RANGE_TEST.search(text):
            return True
        if _HELD_OUT_WORSENS.search(text) or _CONNECTIONS.search(text):
            return True
        found = {t for t in terms if t in self.in_scope_terms}
        if not found:
            return False
        lowered = text.lower()
        if any(word in lowered for word in _FINE_WORDS) and _FINE_CLAUSE.search(text):
            # Words said to be fine put nothing in scope; nor does "the loss" they name.
            text = _FINE_CLAUSE.sub(" ", text)
            found &= {token.term for token in self.analyzer.tokens(text)}
            if not found:
                return False
        for pattern, incidental in _INCIDENTAL_SCOPE:
            if (
                found & incidental
                and pattern.search(text)
                # A loss that is stuck is ours, whatever else the text asks about the loader.
                and (pattern is _LR_RANGE_TEST or not _TRAINING_QUANTITY.search(text))
            ):
                found -= incidental
        return bool(found)

    def _pasted_error(
        self, text: str, code: str, evidence: Sequence[CodeHit]
    ) -> tuple[str, str] | None:
        """The kind and pointer of a pasted non-gradient error the text is about, if any.

        Not when the text also holds an autograd, clipping or scaler error, when the numbers
        read a gradient or loss problem, or when the text outside the error's own lines uses a
        gradient word in its gradient sense ("fixed the import, now the loss is NaN").
        """
        reading = read_errors(text, code)
        if reading is None or reading.gradient_kinds:
            return None
        if any(h.strength >= 0.9 for h in evidence):
            return None
        rest_terms = self.analyzer.terms(reading.rest)
        if self._in_scope(reading.rest, rest_terms):
            return None
        return reading.kind.name.replace("-", " "), reading.kind.pointer

    def _out_of_scope(self, text: str, terms: Iterable[str]) -> bool:
        if self._in_scope(text, terms):
            return False
        return bool(
            _LR_QUESTION.search(_OPTIMIZER_SPEC.sub(" ", text))
            or _DATA_QUESTION.search(text)
            or _TOOLING_QUESTION.search(text)
        )

    # -- the public entry point ------------------------------------------------------------

    def match(self, text: str, code: str | None = None, top_k: int = 5) -> MatchResult:
        """Rank the knowledge entries for ``text`` (and an optional code fragment).

        Never raises on odd input: empty or symbol-only text gives an empty result; very long
        text is cut to its first 20,000 characters.
        """
        text = (text or "")[:_MAX_TEXT]
        code = (code or "")[:_MAX_TEXT] or None
        top_k = max(1, int(top_k))
        weights, terms, fixes, surface, repaired_text = self._query_terms(text)
        known = sum(1 for t in terms if t in self.idf)
        if len(terms) >= _GARBAGE_MIN_TERMS and known < _GARBAGE_KNOWN_FRACTION * len(terms):
            # Mostly words the knowledge never uses (random bytes, another language, a data
            # dump): word matches would be coincidences.
            weights, terms, garbage = {}, [], True
        else:
            garbage = False
        prose_text, text_code, prose_words, code_told = split_code(text)
        prose_repaired = _apply_fixes(prose_text, fixes) if text_code else repaired_text
        if text_code:
            self._soften_code_terms(weights, prose_words, text_code)
        lexical = self._lexical(weights, terms)
        denied = self._denied_terms(repaired_text) if lexical else frozenset()
        if denied:
            self._drop_denied(lexical, denied)

        quantities = read_quantities(repaired_text)
        first_person = bool(_FIRST_PERSON.search(text))
        series = read_series(without_code(repaired_text))
        # "can't fit batch 128 on my 3090" reports; "you can't clip with fp16" claims.
        assertive = bool(_ASSERTION.search(text)) and not (
            first_person and not _STRONG_ASSERTION.search(_WEAK_NEGATION.sub(" ", _own_steps(text)))
        )
        progress = _progress(repaired_text)
        evidence = self._number_evidence(quantities, series, repaired_text, progress)
        # What the text says each quantity does, in metric or plot words (see matcher_frames).
        # Read as written: typo repair knows the index's words, not plot slang ("the counter
        # ticks up" is no "tricks"); the repaired text is the fallback for misspelt names.
        frames = frame_evidence(without_code(text), code or "", text)
        if not frames.hits and repaired_text != text:
            frames = frame_evidence(without_code(repaired_text), code or "", repaired_text)
        if frames.cleared:
            # Every NaN word went to another stage: a reading of a stage the text found finite
            # as non-finite misread its negation ("no nan in any parameter").
            evidence = [h for h in evidence if h.entry_id not in frames.cleared]
        evidence.extend(frames.hits)
        profile_hits = layer_profile_hits(
            without_code(repaired_text), self.profile.early_late_ratio.value, progress.improving
        )
        evidence.extend(profile_hits)
        if _LR_RANGE_TEST.search(text):
            # An LR range test ends when the loss blows up at its top rates, and the numbers it
            # gives are learning rates: the loss readings are the test working, not a diagnosis.
            evidence = [h for h in evidence if h.entry_id not in _RANGE_TEST_READINGS]
        measured_flags = {h.entry_id for h in evidence if h.strength >= 0.9}
        code_text = "\n".join(part for part in (code, text_code) if part)
        code_detected = bool(code_text.strip())
        # Code findings first: among the reasons of one entry, they are the surest.
        code_evidence = (
            code_hits(code_text, prose_text, told=code_told and not code) if code_detected else []
        )
        described = list(code_evidence)
        # Sentence rules read the prose: pasted code is the analyser's (no evidence twice).
        described.extend(prose_hits(prose_repaired))
        cleared = {e for e, pattern in _CLEARED_STAGE.items() if pattern.search(text)}
        cleared |= frames.cleared
        # A check that found it beats a word that other samples were clean ("dumped that batch:
        # isnan().sum() = 3072; every other batch I spot checked is clean").
        cleared -= {h.entry_id for h in described if h.reason in MEASURED_CHECKS}
        if cleared:
            # A stage checked and found clean: a rule that read it as non-finite misread the
            # negation ("the batch has no NaN/Inf").
            described = [
                h
                for h in described
                if h.entry_id not in cleared
                or (h.strength >= 0.7 and h.entry_id not in frames.cleared)
            ]
        evidence.extend(described)
        precision_only = bool(
            _REDUCED_PRECISION.search(text)
            and _ONLY_PRECISION_DIFFERS.search(text)
            and (_FAILS.search(text) or any(h.entry_id == "loss-diverging" for h in evidence))
        )
        if precision_only:
            # The same job trains in full precision and fails in reduced precision: the
            # precision is the cause of the NaN or the divergence the numbers also show.
            evidence.append(
                CodeHit(
                    "amp-diverges",
                    0.9,
                    "text: the run fails only in reduced precision; full precision trains",
                )
            )

        if (
            _HELD_OUT_WORSENS.search(text)
            and not _TRAIN_LOSS_RISES.search(text)
            and not any(h.entry_id == "overfitting" for h in evidence)
        ):
            evidence.append(
                CodeHit(
                    "overfitting",
                    0.6,
                    "text: the held-out loss worsens (rises, or was best at an earlier epoch)",
                )
            )

        if _STABLE_THEN_FELL_APART.search(text) and not any(
            h.entry_id == "diverges-after-stable-start" for h in evidence
        ):
            # "trained perfectly stable for two days ... then overnight it just fell apart":
            # the run itself diverged after a stable start, no loss named (fresh43).
            evidence.append(
                CodeHit(
                    "diverges-after-stable-start",
                    0.6,
                    "text: a run said to go well, then to fall apart or diverge",
                )
            )

        # A question is someone asking about their own case, never a claim being made.
        asking = text.rstrip().endswith("?")
        reporting = bool(_REPORT.search(text)) or asking
        scores: dict[str, float] = {}
        reasons: dict[str, list[str]] = {}
        # A series or a sure number with only a few words around it ("loss at epoch 1: 0.82,
        # epoch 2: ...") is a measurement: those words are context, not the message.
        # So is pasted code with hardly a sentence around it: the analyser reads the code, and
        # the words of its identifiers only echo it.
        measured = any(h.strength >= 0.9 for h in evidence) and bool(series)
        analysed = code_detected and any(h.strength >= 0.9 for h in described)
        if measured or analysed:
            words_read = self.analyzer.terms(prose_words) if text_code else terms
            content = len({t for t in words_read if t in self.idf})
            word_share = min(1.0, 0.25 + 0.25 * content)
        else:
            word_share = 1.0
        moves = bool(_MOVEMENT.search(prose_words if text_code else text))
        claim_lexical: dict[str, _Lexical] = {}
        ruled_claim = any(
            h.entry_id in self.cards and self.cards[h.entry_id].kind == "rationalization"
            for h in evidence
        )
        if assertive and lexical and not ruled_claim:
            # (A sentence rule that already names the claim is surer than the words.)
            start = _CLAIM_START.search(prose_words if text_code else text)
            if start is not None and start.start() > 0:
                claim_weights, claim_terms, *_ = self._query_terms(
                    (prose_words if text_code else text)[start.start() :]
                )
                claim_lexical = self._lexical(claim_weights, claim_terms)
        premise_met: dict[re.Pattern[str], bool] = {}
        for entry_id, lex in lexical.items():
            score = lex.score * word_share
            claim = claim_lexical.get(entry_id)
            if claim is not None and self.cards[entry_id].kind == "rationalization":
                score += _CLAIM_PART_WEIGHT * claim.score * word_share
            if entry_id in _MOVEMENT_SYMPTOMS and not moves:
                score *= _NO_MOVEMENT_PRIOR
            premise = _PREMISES.get(entry_id) or _PREMISES.get(entry_id.split("-")[0] + "-")
            if premise is not None and premise not in premise_met:
                # Several entries share one premise: search the text once per pattern.
                premise_met[premise] = bool(premise.search(text) or premise.search(code or ""))
            clip_belief = "clip" in entry_id and self.cards[entry_id].kind == "rationalization"
            if premise is None and clip_belief:
                # A belief about clipping needs clipping in the text, like any other
                # technique ("they're inherently unstable" with no word of clipping is not the
                # conflicting clipping advice).
                premise = _CLIPPING
                if premise not in premise_met:
                    premise_met[premise] = bool(premise.search(text) or premise.search(code or ""))
            elif premise is not None and premise is not _CLIPPING and clip_belief:
                if _CLIPPING not in premise_met:
                    premise_met[_CLIPPING] = bool(
                        _CLIPPING.search(text) or _CLIPPING.search(code or "")
                    )
                if not premise_met[_CLIPPING]:
                    premise = _CLIPPING
            if premise is not None and not premise_met[premise]:
                # An entry about a technique the text never mentions ("my first conv layers
                # don't learn" is not about sigmoid stacks, "don't need warmup" not about
                # batch norm). A belief about a technique the text never names is not held:
                # its claim words ("the two interfere") fit the technique the text does name.
                score *= _UNSUPPORTED_PRIOR
                if self.cards[entry_id].kind == "rationalization":
                    score *= _UNSUPPORTED_CLAIM_PRIOR
            kind = self.cards[entry_id].kind
            if kind == "rationalization" and assertive:
                score *= _RATIONALIZATION_PRIOR
            elif kind == "rationalization" and reporting:
                # Someone describing their own run is not making the claim.
                score *= _RATIONALIZATION_REPORT_PRIOR
            elif kind == "symptom" and reporting and not assertive:
                score *= _SYMPTOM_PRIOR
            elif (
                (kind == "symptom" or (kind == "signal" and claim_lexical))
                and assertive
                and not asking
            ):
                # A claim about the cause is answered by the rationalization, not the symptom
                # (nor the signal the report before a stated belief names).
                score *= _SYMPTOM_CLAIM_PRIOR
            elif kind == "red-flag" and code_detected:
                score *= _RED_FLAG_CODE_PRIOR
            elif kind == "red-flag" and assertive:
                # Advice about a technique, with no code, is a claim rather than a code mistake.
                score *= _RED_FLAG_ADVICE_PRIOR
            scores[entry_id] = score
        for hit in evidence:
            if assertive and hit.advice_id in self.cards:
                # Recommending the mistake is the rationalization, not the code red flag.
                hit = CodeHit(hit.advice_id or "", hit.strength, hit.reason)
            if hit.entry_id not in self.cards:
                continue
            scores[hit.entry_id] = scores.get(hit.entry_id, 0.0) + _EVIDENCE_WEIGHT * hit.strength
            if hit.reason not in reasons.setdefault(hit.entry_id, []):
                reasons[hit.entry_id].append(hit.reason)
        for entry_id in frames.discounted() & scores.keys():
            # The trend words belong to another quantity ("the grad panel is a flat line":
            # not a loss plateau), or a quantity read as healthy contradicts the entry.
            scores[entry_id] *= _FRAME_DISCOUNT
        if "loss-stuck" in scores and any(h.entry_id == "plateau" for h in evidence):
            # A plateau reading says the loss fell first: not stuck from the start.
            scores["loss-stuck"] *= 0.7
        train_loss = next((s.values for s in series if s.name == "loss"), ())
        if (
            "loss-stuck" in scores
            and len(train_loss) >= 2
            and _decreasing(train_loss)
            and train_loss[-1] <= _LOSS_FALLEN * train_loss[0]
        ):
            # The numbers show the loss coming down: it is not stuck.
            scores["loss-stuck"] *= 0.5
        if _LOSS_FINITE.search(text):
            # "NaN in the gradients while the loss is still finite": not a NaN loss.
            for entry_id in ("loss-nan", "nan-loss-before-backward"):
                if entry_id in scores:
                    scores[entry_id] *= 0.5
        for hit in described:
            belief = ADVICE_FOR.get(hit.entry_id)
            if hit.reason in MEASURED_CHECKS and belief in scores:
                # The text reports a check that found it ("isinf(batch).any() -> True"): the
                # belief that would blame it unchecked is not what is being said.
                scores[belief] *= _MEASURED_BELIEF_PRIOR
        ruled = {h.entry_id for h in described if h.strength >= 0.5}
        for broad, narrower in SUPERSEDED_BY.items():
            if broad in scores and ruled & narrower:
                # A rule read the narrower case ("output 0 for every input": dead units): the
                # broader entry's shared words do not outrank it.
                scores[broad] *= _SUPERSEDED_PRIOR
        asked = {h.entry_id for h in described if h.entry_id in _WHETHER_TO_USE}
        for entry_id in asked:
            # "Should I add clipping to my U-Net (BatchNorm, residual blocks)?": the question is
            # about the technique it asks whether to use; the others it names describe the
            # model, and a belief about them that no rule found is not what is asked.
            for other, score in list(scores.items()):
                premise = _PREMISES.get(other)
                card = self.cards.get(other)
                if (
                    card is not None
                    and card.kind == "rationalization"
                    and premise is not None
                    and not premise.search(_WHETHER_TO_USE[entry_id])
                    and not any(h.entry_id == other for h in evidence)
                ):
                    scores[other] = score * _OTHER_TECHNIQUE_PRIOR
        for entry_id in cleared & scores.keys():
            # The text checked that stage and found it finite: the NaN began elsewhere.
            scores[entry_id] *= 0.4
        if OUT_OF_SCOPE_ID in scores and any(
            h.strength >= 0.9 and h.entry_id != OUT_OF_SCOPE_ID for h in evidence
        ):
            # A gradient or loss reading the numbers are sure of keeps the text ours, whatever
            # it also says about the learning rate.
            scores[OUT_OF_SCOPE_ID] *= 0.5
        zero_counts = [m.span() for m in _ZERO_NAN_COUNT.finditer(text)] if "0" in text else []
        if zero_counts and all(
            any(start <= m.start() < end for start, end in zero_counts)
            for m in _NAN_WORD.finditer(text)
        ):
            # Every NaN the text names is a monitor's count reading zero: nothing is non-finite.
            for entry_id in [e for e in scores if "nan" in e or "nonfinite" in e]:
                scores[entry_id] *= 0.4
        lightning = "lightning-needs-manual-clipping"
        whole = text + "\n" + (code or "")
        if (
            lightning in scores
            and _LIGHTNING_CLIPS.search(whole)
            and not _HAND_CLIPPING.search(whole)
        ):
            # The run sets gradient_clip_val and writes no clipping of its own: Lightning
            # clips for it, so the belief that it must clip by hand is not in the text.
            scores[lightning] *= _LIGHTNING_CLIPS_KEEP
        contradicted = (self._contradicted(quantities) | frames.ruled_out) & scores.keys()
        # A measured gradient norm that every reading puts beyond the exploding (or below the
        # vanishing) level: the entries of the opposite size, shared words and no evidence of
        # their own ("grad norm 3.4e+04" is no norm decaying towards zero).
        contradicted |= (
            self._opposite_size(quantities) - {h.entry_id for h in evidence}
        ) & scores.keys()
        if "zero-gradients" in scores and _ZERO_DENIED.search(text):
            # "tiny, but none of them is exactly zero": the words of the zero-gradient entry,
            # said to be absent.
            contradicted.add("zero-gradients")
        smooth_loss = next(
            (
                s.values
                for s in series
                if s.name == "loss"
                and len(s.values) >= 4
                and s.values[-1] < s.values[0]
                and all(b <= 1.05 * a for a, b in itertools.pairwise(s.values))
            ),
            None,
        )
        if smooth_loss is not None:
            # The loss the text prints falls at every reading: whatever jumps, it is not the
            # loss (the words "jumps" and "loss" side by side are no loss spike).
            contradicted |= {"loss-spikes", "loss-diverging"} & scores.keys()
        for entry_id in contradicted:
            # The text gives the entry's own number inside its normal band.
            scores[entry_id] *= 0.5
        if (
            contradicted
            and progress.improving
            and not any(h.strength >= 0.8 and h.entry_id != "healthy" for h in evidence)
        ):
            # The number the text worries about is inside its normal band and training
            # improves: the answer is that the run is healthy ("3% of units never fire,
            # accuracy improving", "grad/param ratio 1e-3 with SGD, loss going down").
            scores["healthy"] = scores.get("healthy", 0.0) + _EVIDENCE_WEIGHT * 0.5
            reasons.setdefault("healthy", []).append(
                "the value the text worries about is inside its normal band ("
                + ", ".join(sorted(contradicted))
                + " not shown) and training improves"
            )
        if "underfitting" in scores and (
            progress.held_out_improving or (progress.no_gap and not _LOSS_BAD_LEVEL.search(text))
        ):
            # Underfitting is both losses stuck high: not when the text says both improve, nor
            # when held-out follows training and nothing is called high or stuck.
            scores["underfitting"] *= 0.4
        if "overfitting" in scores and (
            progress.held_out_improving or progress.no_gap or not _HELD_OUT_ANY.search(text)
        ):
            # Overfitting is held-out results getting worse: not when the text says they
            # improve or follow the training ones, nor when it says nothing about held-out
            # data at all.
            scores["overfitting"] *= 0.5
        named = {
            hit.entry_id
            for hit in described
            if hit.strength >= 0.5 and not (assertive and hit.advice_id)
        }
        if lexical:
            # Named by its id's words in the sentences, not in pasted code ("clip", "step").
            prose_terms = set(self.analyzer.terms(prose_words)) if text_code else set(terms)
            prose_lower = (prose_words if text_code else text).lower()
            named |= {
                entry_id
                for entry_id, lex in lexical.items()
                if lex.named
                and self._id_terms[entry_id] <= prose_terms
                and self._says_order_words(entry_id, prose_lower)
            }
        # A red flag the numbers show ("max_grad_norm 100, the norm never crossed 100": the clip
        # never fires) is measured: it explains the symptom told next to it, like a named cause.
        # A stage the text checked and found finite is not named by its words ("no nan in any
        # parameter" says nan and parameter).
        named -= frames.cleared
        measured_causes = (measured_flags & self.effects.keys()) - named
        self._put_causes_first(scores, reasons, named | measured_causes, measured_causes)
        for hit in profile_hits:
            # Per-layer norms that show the early layers starved explain a loss that does not
            # move: the measured cause ranks above the symptom.
            explained = [e for e in _PROFILE_EXPLAINS.get(hit.entry_id, ()) if e in scores]
            if hit.entry_id in scores and explained:
                top = max(scores[e] for e in explained)
                if scores[hit.entry_id] <= top:
                    scores[hit.entry_id] = top + 1.0
        located = frames.located
        if located in scores:
            # A NaN hunt that found one stage finite and the next non-finite has located the
            # NaN: that stage's entry is the answer, above the NaN symptom it explains and the
            # other stages and observations the same words fit.
            observed = [
                score
                for entry_id, score in scores.items()
                if entry_id != located and self.cards[entry_id].kind in ("symptom", "signal")
            ]
            if observed and scores[located] <= max(observed):
                scores[located] = max(observed) + 1.0
        chain = [
            h.entry_id for h in frames.hits if h.entry_id in scores and h.entry_id != "healthy"
        ]
        if len(chain) >= 2 and scores[chain[0]] <= max(scores[e] for e in chain[1:]):
            # "The grad panel goes vertical, then the loss chart is blank": the first event told
            # is what the later ones follow from.
            scores[chain[0]] = max(scores[e] for e in chain[1:]) + 1.0
            reasons.setdefault(chain[0], []).append(
                "the first of the events the text tells in order (" + ", ".join(chain[1:]) + ")"
            )
        if precision_only and "amp-diverges" in scores:
            # The precision is the cause of the NaN / divergence told with it: it ranks first.
            symptom_score = max((scores.get(e, 0.0) for e in _PRECISION_EFFECTS), default=0.0)
            if scores["amp-diverges"] <= symptom_score:
                scores["amp-diverges"] = symptom_score + 1.0
        found_in_code = {h.entry_id for h in code_evidence if h.strength >= 0.8}
        told_words = prose_words if text_code else text
        reviewed = [
            h
            for h in code_evidence
            if h.strength >= _REVIEWED_FINDING
            and h.entry_id in scores
            and h.entry_id not in _WHOLE_SCRIPT_NOTES
        ]
        if reviewed and _REVIEW_REQUEST.search(told_words) and not _RUN_PROBLEM.search(told_words):
            # Code handed over for review with nothing said to have gone wrong: what the
            # analyser found in it is the answer, above symptoms the words only resemble.
            best = max(reviewed, key=lambda h: (h.strength, scores[h.entry_id])).entry_id
            top = max(scores.values())
            if scores[best] < top:
                scores[best] = top + 0.5
                reasons.setdefault(best, []).append("found in the code handed over for review")
        self._put_severe_first(scores, found_in_code)
        if not assertive:
            self._put_code_findings_first(scores, reasons, found_in_code)
            self._put_code_red_flag_first(scores, reasons, found_in_code)
            if first_person:
                # Someone telling what their own loop does ("we clip ..., unscale_ is not
                # called") reports a mistake, not a claim: the sentence rule's red flag ranks
                # above a rationalization no rule points at.
                told = {
                    h.entry_id
                    for h in described
                    if h.strength >= 0.5
                    and self.cards.get(h.entry_id) is not None
                    and self.cards[h.entry_id].kind == "red-flag"
                }
                self._put_code_findings_first(
                    scores,
                    reasons,
                    told,
                    unless=[h.entry_id for h in evidence],
                    why="described in the text as what the loop does",
                )
        whole_step = (
            code_detected
            and not (code_told and not code)
            and bool(_BACKWARD_CALL.search(code_text) and _STEP_CALL.search(code_text))
            and fragment_source(code_text) is not None
        )
        if whole_step:
            # The analyser read a whole step: an order mistake it did not find is not in the
            # code, however many of its words the text shares ("worried about the unscale
            # placement" over a loop that unscales in the right place).
            reported = {h.entry_id for h in code_evidence}
            for entry_id in _ORDER_RED_FLAGS - reported:
                if entry_id in scores:
                    scores[entry_id] *= _NOT_IN_CODE_PRIOR
        if code_detected and "no-grad-monitoring" in scores and measures_grad_norm(code_text):
            # The code computes the gradient norm (a hand-written loop over the parameters'
            # .grad, or clip_grad_norm_'s return value): it monitors, whatever its words share
            # with "no monitoring" ("here is my training loop").
            del scores["no-grad-monitoring"]
        if (
            whole_step
            and not evidence_beyond(evidence, _WHOLE_SCRIPT_NOTES)
            and _REVIEW_REQUEST.search(prose_words if text_code else text)
            and not _RUN_PROBLEM.search(prose_words if text_code else text)
        ):
            self._put_clean_step_first(scores, reasons)

        # A whole-script note ("no gradient monitoring") on a pasted fragment says nothing of the
        # question: an LR range test's loop logs no gradient norm either.
        out_of_scope = (
            not garbage
            and self._out_of_scope(text, terms)
            and not evidence_beyond(evidence, _WHOLE_SCRIPT_NOTES)
        )
        if not out_of_scope and scores and OUT_OF_SCOPE_ID in scores:
            best = max(scores, key=lambda k: scores[k])
            out_of_scope = best == OUT_OF_SCOPE_ID and not self._in_scope(text, terms)
        # Read even in text the word ranker calls garbage: a launcher's log line is mostly
        # words the knowledge never uses.
        error = self._pasted_error(text, code or "", evidence)
        pointer = None
        if error is not None and OUT_OF_SCOPE_ID in self.cards:
            # A pasted error that is no gradient failure (an import, a loader worker, a shape,
            # a device, memory in evaluation): what the rest of the text says decides nothing.
            out_of_scope = True
            top = max(scores.values(), default=0.0)
            scores[OUT_OF_SCOPE_ID] = max(scores.get(OUT_OF_SCOPE_ID, 0.0), top + 1.0)
            reasons.setdefault(OUT_OF_SCOPE_ID, []).insert(
                0,
                f"a pasted {error[0]} error that is not a gradient failure, and the rest of the "
                "text reports no gradient problem",
            )
            pointer = error[1]
        elif out_of_scope and OUT_OF_SCOPE_ID in self.cards:
            top = max(scores.values(), default=0.0)
            scores[OUT_OF_SCOPE_ID] = max(scores.get(OUT_OF_SCOPE_ID, 0.0), top + 1.0)
            reasons.setdefault(OUT_OF_SCOPE_ID, []).insert(
                0,
                "a learning-rate-only or data-only question (or the job's plumbing: checkpoints, "
                "loaders), no gradient terms",
            )
            pointer = self.cards[OUT_OF_SCOPE_ID].pointer
        elif OUT_OF_SCOPE_ID in scores and self._in_scope(text, terms):
            # Gradient words present: the question is ours even if it also mentions the LR.
            del scores[OUT_OF_SCOPE_ID]

        # The learned re-ranker (knowledge/rerank.py) re-orders the first rerank.DEPTH.
        reranking = not out_of_scope and rerank.enabled()
        ranked = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
        ranked = ranked[: rerank.depth(ranked, top_k) if reranking else top_k]
        for entry_id, _ in ranked:
            if entry_id in lexical:
                reasons.setdefault(entry_id, []).extend(
                    self._lexical_reasons(entry_id, lexical[entry_id], surface)
                )
        if fixes:
            note = "typo: " + "; ".join(
                f"read '{raw}' as '{fixed}'" for raw, fixed in fixes.items()
            )
            for entry_id, _ in ranked:
                reasons.setdefault(entry_id, []).append(note)
        matches = [
            Match(
                id=entry_id,
                kind=self.cards[entry_id].kind,
                score=round(score, 4),
                title=self.cards[entry_id].title,
                severity=self.cards[entry_id].severity,
                reasons=reasons.get(entry_id, []),
            )
            for entry_id, score in ranked
        ]
        if reranking:
            matches = rerank.rerank_matches(text, code, matches, code_detected)[:top_k]
        return MatchResult(
            matches=matches,
            out_of_scope=out_of_scope,
            pointer=pointer,
            numbers=_numbers(quantities),
            series={item.name: list(item.values) for item in series},
            code_detected=code_detected,
        )


def evidence_beyond(hits: Iterable[CodeHit], notes: frozenset[str]) -> bool:
    """Whether any rule fired on an entry outside ``notes``."""
    return any(h.entry_id not in notes for h in hits)


#: "I walk over the parameters, divide each .grad ...": the clause after the comma goes on
#: with the same subject, it is not an order to the reader.
_OWN_STEPS = _regex.compile(
    r"(\b(?:i|we)\s+(?:[^.;!?,\n]|\.(?=\w))+),(?=\s*(?:then\s+)?[a-z])", re.I
)


def _own_steps(text: str) -> str:
    """``text`` with the commas of a first-person list of actions read as "and"."""
    for _ in range(4):
        joined = _OWN_STEPS.sub(r"\1 and", text)
        if joined == text:
            break
        text = joined
    return text


def _apply_fixes(text: str, fixes: dict[str, str]) -> str:
    """``text`` with each misspelt word replaced by its repair (for the number/prose rules)."""
    if not fixes:
        return text
    pattern = re.compile(
        r"(?<![A-Za-z])(" + "|".join(re.escape(w) for w in fixes) + r")(?![A-Za-z])",
        re.IGNORECASE,
    )
    return pattern.sub(lambda m: fixes.get(m.group(1).lower(), m.group(1)), text)


def _numbers(quantities: Sequence[Quantity]) -> dict[str, float]:
    out: dict[str, float] = {}
    for q in quantities:
        if q.name not in out:
            out[q.name] = q.value
            continue
        old = out[q.name]
        if not math.isfinite(q.value) or (
            math.isfinite(old)
            and abs(math.log10(abs(q.value) + 1e-300)) > abs(math.log10(abs(old) + 1e-300))
        ):
            out[q.name] = q.value
    return out


def _build_index(kb: KnowledgeBase, profile: str | None) -> dict[str, Any]:
    """The BM25F index and everything a match reads, as plain data (see ``Matcher._adopt``)."""
    synonyms = load_synonyms()
    analyzer = Analyzer(synonyms)
    docs: list[tuple[str, dict[str, float], float, list[tuple[str, list[str]]], list[str]]] = []
    surface: Counter[str] = Counter()
    df: Counter[str] = Counter()
    for entry in kb.entries.values():
        tf: dict[str, float] = {}
        length = 0.0
        sentences: list[tuple[str, list[str]]] = []
        for field_name, texts in _field_texts(entry):
            weight = FIELD_WEIGHTS[field_name]
            for text in texts:
                tokens = analyzer.tokens(text)
                surface.update(t.raw for t in tokens if t.raw.isalpha())
                terms = [t.term for t in tokens]
                for term in terms:
                    tf[term] = tf.get(term, 0.0) + weight
                for gram in _bigrams(terms):
                    tf[gram] = tf.get(gram, 0.0) + weight * _PHRASE_WEIGHT
                length += weight * len(terms)
                if field_name in SENTENCE_FIELDS and terms:
                    sentences.append((text, sorted(set(terms))))
        df.update(tf.keys())
        id_sequence = analyzer.terms(entry.id.replace("-", " "))
        docs.append((entry.id, tf, length, sentences, id_sequence))
    count = len(docs)
    avg_length = sum(d[2] for d in docs) / max(count, 1)
    idf = {term: math.log(1.0 + (count - n + 0.5) / (n + 0.5)) for term, n in df.items()}
    postings: dict[str, list[tuple[int, float]]] = {}
    norms: list[float] = []
    for index, (_, tf, length, _, _) in enumerate(docs):
        norms.append(_K1 * (1.0 - _B + _B * length / avg_length))
        for term, frequency in tf.items():
            postings.setdefault(term, []).append((index, frequency))
    # The typo vocabulary is the surface words of the entries plus the synonym table, so a
    # misspelt variant ("mixed precison") is repaired to a word the analyser knows.
    vocab = vocabulary([*synonyms.word_to_canonical, *synonyms.phrase_to_canonical])
    for word, n in surface.items():
        vocab[word] = vocab.get(word, 0) + n
    cards = [EntryCard.of(entry) for entry in kb.entries.values()]
    return {
        "format": _SNAPSHOT_FORMAT,
        "profile": _Profile.of(kb, profile).data(),
        "synonyms": [
            dict(synonyms.word_to_canonical),
            dict(synonyms.phrase_to_canonical),
            {k: list(v) for k, v in synonyms.related.items()},
        ],
        "docs": [
            (
                entry_id,
                [(text, terms, sum(idf[t] for t in terms)) for text, terms in sentences],
                sorted(set(id_sequence)),
                id_sequence,
            )
            for entry_id, _, _, sentences, id_sequence in docs
        ],
        "idf": idf,
        "postings": {
            term: array("d", [x for pair in pairs for x in pair]).tobytes()
            for term, pairs in postings.items()
        },
        "norms": norms,
        "vocabulary": vocab,
        "default_idf": math.log(1.0 + (count + 0.5) / 0.5),
        "in_scope": sorted(set(analyzer.terms(IN_SCOPE_WORDS))),
        "effects": {k: sorted(v) for k, v in _effects(kb).items()},
        "cards": [
            [
                c.id,
                c.kind,
                c.title,
                c.severity,
                c.pointer,
                c.say_instead,
                c.fix,
                list(c.first_checks),
                list(c.snippets),
            ]
            for c in cards
        ],
    }


#: Signals the catalogue defines as the origin of what they relate to: a batch that already
#: holds NaN/Inf (the data pipeline), a loss already non-finite before backward() (the loss
#: function). Named in a text, they explain the NaN symptoms and signals, like a red flag.
_ORIGIN_SIGNALS = ("nonfinite-inputs", "nan-loss-before-backward")


def _effects(kb: KnowledgeBase) -> dict[str, frozenset[str]]:
    """For each red flag and origin signal, the symptoms and signals it explains.

    A red flag explains what lists it in ``causes`` and what it lists in ``related``; an origin
    signal explains what it lists in ``related``.
    """
    observed = ("symptom", "signal")
    out: dict[str, frozenset[str]] = {}
    for origin in _ORIGIN_SIGNALS:
        if origin in kb.entries:
            related = getattr(kb.entries[origin], "related", ())
            out[origin] = frozenset(e for e in related if kb.entries[e].kind in observed)
    for flag in kb.by_kind("red-flag"):
        found = {e for e in getattr(flag, "related", ()) if kb.entries[e].kind in observed}
        for entry in kb.entries.values():
            caused = flag.id in getattr(entry, "causes", ())
            if caused or (entry.kind == "signal" and flag.id in getattr(entry, "related", ())):
                found.add(entry.id)
        out[flag.id] = frozenset(found)
    return out


_ACCURACY = _regex.compile(
    r"\b(?P<split>train\w*|val\w*|valid\w*|test|eval\w*|dev)[\s_/-]*(?:set\s+)?"
    r"(?:acc(?:uracy)?|top-?1)\b\s*(?:is\s+|of\s+|at\s+|[:=]\s*)?~?\s*(?P<value>\d+(?:\.\d+)?)\s*%",
    re.IGNORECASE,
)
#: Points between train and held-out accuracy that read as overfitting (the matcher's own line;
#: the seeds describe the pattern, not a number).
_ACCURACY_GAP_POINTS = 20.0


def _accuracy_gap(text: str) -> CodeHit | None:
    """Train accuracy far above held-out accuracy ("train acc 100%, test acc 55%")."""
    train = held_out = None
    for m in _ACCURACY.finditer(text):
        value = float(m.group("value"))
        if m.group("split").lower().startswith("train"):
            train = value
        else:
            held_out = value
    if train is None or held_out is None or train - held_out < _ACCURACY_GAP_POINTS:
        return None
    return CodeHit(
        "overfitting",
        0.9,
        f"train accuracy {train:g}% against {held_out:g}% on held-out data: "
        f"{train - held_out:g} points apart",
    )


def _names(doc: _Doc, terms: Sequence[str]) -> bool:
    """Whether ``terms`` say the entry's id: all its words close together ("clip after the
    optimizer step" names clip-after-step; "clipping ... on those 40 steps" does not)."""
    wanted = doc.id_terms
    window = len(doc.id_sequence) + 2
    return any(
        term in wanted and wanted <= set(terms[start : start + window])
        for start, term in enumerate(terms)
    )


def _median(values: Iterable[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2 if ordered else 0.0


def _shown(values: Sequence[float]) -> str:
    head = " → ".join(fmt(v) for v in values[:6])
    return head + (" → …" if len(values) > 6 else "")


def _decreasing(values: Sequence[float]) -> bool:
    return len(values) >= 2 and values[-1] < values[0] and rank_correlation(list(values)) <= -0.6


def _isolated_spikes(values: Sequence[float], factor: float) -> list[int]:
    """Indices of values above ``factor`` × the median of the others, with normal neighbours.

    The first and last values are never spikes: nothing around them shows a jump and a return.
    """
    spikes: list[int] = []
    for i in range(1, len(values) - 1):
        others = [v for j, v in enumerate(values) if j != i]
        median = _median(others)
        if median <= 0 or values[i] <= factor * median:
            continue
        # A jump up from the step before and back down after: a trend's first value is not one.
        neighbours = (values[i - 1], values[i + 1])
        if all(v <= factor * median and values[i] > factor * v for v in neighbours):
            spikes.append(i)
    return spikes


#: Bumped when the snapshot's layout changes (the cache key also covers the matcher's source).
_SNAPSHOT_FORMAT = 3
#: The files whose content decides the index: the entries, synonyms and thresholds, and the
#: code that reads them and builds the index.
_INDEX_SOURCES = ("matcher.py", "_text.py", "loader.py", "models.py", "findings.py")

_LOCK = threading.Lock()
_MATCHER: Matcher | None = None


def snapshot_path() -> Path | None:
    """Where the default matcher's index snapshot lives, or None when caching is off.

    ``$GRADIENT_DOCTOR_CACHE_DIR`` (empty: off), else ``$XDG_CACHE_HOME/gradient-doctor``, else
    ``~/.cache/gradient-doctor``. The file name carries a hash of everything the index is built
    from (data files, the code that reads them, the Python version), so an edited entry or a
    new release never reads an old snapshot.
    """
    root = cache_root()
    if root is None:
        return None
    digest = hashlib.sha256(f"{_SNAPSHOT_FORMAT}|{sys.version}".encode())
    # The package's own folder (not importlib.resources, which imports tempfile and more).
    package = Path(__file__).resolve().parent
    data = package / "data"
    for item in sorted(data.iterdir(), key=lambda t: t.name):
        if item.name.endswith((".yaml", ".yml")):
            digest.update(item.name.encode() + b"\0" + item.read_bytes())
    for name in _INDEX_SOURCES:
        digest.update(name.encode() + b"\0" + (package / name).read_bytes())
    return root / f"matcher-{digest.hexdigest()[:24]}.marshal"


def _load_snapshot(path: Path) -> Matcher | None:
    try:
        data = marshal.loads(path.read_bytes())
        return Matcher.from_snapshot(data)
    except (OSError, EOFError, ValueError, TypeError, KeyError):
        return None


def _save_snapshot(path: Path, matcher: Matcher) -> None:
    """Write atomically (a temp file renamed into place); a read-only cache is not an error."""
    import tempfile  # only when a snapshot is written (tempfile imports random, hashlib...)

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(dir=path.parent, prefix=".matcher-", suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(marshal.dumps(matcher.snapshot()))
            os.replace(temp, path)
        finally:
            if os.path.exists(temp):
                os.unlink(temp)
        _prune_snapshots(path)
    except (OSError, ValueError):
        return


#: Snapshots of other versions untouched this long are removed when a new one is written.
_STALE_SNAPSHOT_SECONDS = 7 * 24 * 3600


def _prune_snapshots(keep: Path) -> None:
    """Remove other versions' snapshots nobody has written for a week (an upgrade leaves the
    old one behind; a second install in use keeps refreshing its own)."""
    import time

    now = time.time()
    for old in keep.parent.glob("matcher-*.marshal"):
        try:
            if old != keep and now - old.stat().st_mtime > _STALE_SNAPSHOT_SECONDS:
                old.unlink()
        except OSError:
            continue


def get_matcher() -> Matcher:
    """The process-wide matcher over the packaged knowledge (built on first use).

    A snapshot of the index is reused across processes (see :func:`snapshot_path`): a fresh
    ``gradient-doctor match`` then neither parses YAML nor builds the knowledge models.
    """
    global _MATCHER
    if _MATCHER is None:
        with _LOCK:
            if _MATCHER is None:
                _MATCHER = _default_matcher()
    return _MATCHER


def _default_matcher() -> Matcher:
    try:
        path = snapshot_path()
    except OSError:
        path = None
    if path is not None and path.is_file():
        cached = _load_snapshot(path)
        if cached is not None:
            return cached
    from gradient_doctor.knowledge.loader import load_knowledge

    matcher = Matcher(load_knowledge())
    if path is not None:
        _save_snapshot(path, matcher)
    return matcher


def match(text: str, code: str | None = None, top_k: int = 5) -> MatchResult:
    """Rank knowledge entries for free ``text`` (and an optional ``code`` fragment).

    Returns a :class:`MatchResult`: ``matches`` best first (each with id, kind, score, title,
    severity and the reasons it matched), ``out_of_scope``/``pointer`` for learning-rate-only
    and data-only questions, and ``numbers``, the quantities read from the text.
    """
    return get_matcher().match(text, code=code, top_k=top_k)
