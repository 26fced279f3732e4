"""Train the matcher's re-ranker (``knowledge/rerank.py``) and measure it.

    python scripts/train_reranker.py collect   # first-look lists from the git history
    python scripts/train_reranker.py train     # rewrite knowledge/data/rerank.json
    python scripts/train_reranker.py cv        # leave-one-group-out / leave-one-round-out

Training data are the items of ``tests/knowledge/match_eval.yaml`` only, seen two ways:

* through today's matcher (its top :data:`rerank.DEPTH` candidates), which was tuned on these
  items and ranks nearly all of them right;
* through the matcher as it was when each ``fresh*`` / ``dev*`` group was added, before any
  tuning on it (the "first-look" lists; the header of match_eval.yaml records their scores and
  ``collect`` reproduces them). Those lists carry the mistakes a matcher makes on an author it
  has never seen, which is what the re-ranker has to learn to correct: today's matcher on its
  own tuning set has almost none left. ``collect`` checks out each first-look commit with
  ``git archive`` into a temporary folder and runs its matcher in a subprocess; the lists are
  stored in ``scripts/rerank_first_look.json.gz`` so that ``train`` needs neither git nor old
  code (re-run ``collect`` after new groups are added to the eval file).

After the matcher or the eval file changes (another round merged):

    python scripts/train_reranker.py collect   # only when groups were added (~1 min)
    python scripts/train_reranker.py train     # ~1 min on 2 cores, deterministic
    python -m pytest tests/knowledge -q        # known_miss marks: an item the re-ranked
                                               # matcher now gets right fails as XPASS

and, before trusting the switch again, ``cv`` (held-out scores; ~10 min per run).

The model is linear over :func:`rerank.candidate_features`, trained with a softmax (listwise)
loss over each list's candidates and L2 penalties (one for the dense features, a stronger one
for the hashed word features), by L-BFGS in numpy (numpy comes with matplotlib, a run-time
dependency; the matcher itself never imports it). Everything is deterministic.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Today's matcher must produce its own order while the training lists are read.
os.environ["GRADIENT_DOCTOR_RERANK"] = "0"

import numpy as np
import yaml

from gradient_doctor.knowledge import rerank
from gradient_doctor.knowledge.rerank import Candidate

REPO = Path(__file__).resolve().parent.parent
EVAL_FILE = REPO / "tests" / "knowledge" / "match_eval.yaml"
HISTORY_FILE = REPO / "scripts" / "rerank_first_look.json.gz"
WEIGHTS_FILE = REPO / "knowledge" / "data" / "rerank.json"

#: Hyper-parameters, chosen by ``cv`` (leave-one-round-out top-1 on the first-look lists).
L2_DENSE = 1.0
L2_CROSSED = 3.0
#: Weight of a list from today's matcher relative to a first-look list.
TODAY_WEIGHT = 0.5
ITERATIONS = 150
#: Weights smaller than this are not written (they change no ranking; a smaller file).
KEEP_ABOVE = 0.01

#: Groups written together, or written after reading another group's misses (a dev group
#: aimed at them): held out together by ``cv --by round``.
ROUNDS = {
    "dev20": "fresh19",
    "dev21": "fresh19",
    "fresh21": "fresh20",
    "dev22": "fresh20",
    "fresh23": "fresh22",
    "fresh25": "fresh24",
    "dev24": "fresh24",
    "fresh27": "fresh26",
    "dev26": "fresh26",
    "fresh29": "fresh28",
    "dev28": "fresh28",
    # fresh30-fresh35 were written in parallel and scored together; dev30 was written for
    # their misses.
    **{f"fresh{n}": "fresh30" for n in range(31, 36)},
    "dev30": "fresh30",
    # fresh36-fresh39 were written in parallel; dev31 was written for their misses.
    **{f"fresh{n}": "fresh36" for n in range(37, 40)},
    "dev31": "fresh36",
    # fresh40 and fresh41 were written in parallel and retired together.
    "fresh41": "fresh40",
}


def load_items() -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = yaml.safe_load(EVAL_FILE.read_text(encoding="utf-8"))["items"]
    return items


def item_key(item: dict[str, Any]) -> str:
    """An item's identity across edits of other items: its text and code."""
    raw = item["text"] + "\0" + (item.get("code") or "")
    return hashlib.sha1(raw.encode()).hexdigest()[:16]


def blind_group(group: str) -> bool:
    """Groups written before the matcher was tuned on them (the early groups were the tuning
    set from the start)."""
    return group.startswith(("fresh", "dev"))


# ---- collect: first-look lists from the git history ------------------------------------------

_RUNNER = r"""
import json, sys
from gradient_doctor.knowledge import matcher
items = json.load(sys.stdin)
out = []
for item in items:
    r = matcher.match(item["text"], code=item.get("code"), top_k=int(sys.argv[1]))
    out.append({
        "out_of_scope": bool(getattr(r, "out_of_scope", False)),
        "code_detected": bool(getattr(r, "code_detected", False)),
        "candidates": [
            [m.id, str(getattr(m, "kind", "")), float(m.score), list(m.reasons)]
            for m in r.matches
        ],
    })
print(json.dumps(out))
"""


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def first_look_commit(group: str) -> str | None:
    """The commit just before the group first appeared in the eval file."""
    pattern = f"group: {group}([,}}]|$)"
    added = _git("log", "--reverse", "--format=%H", "-E", "-G", pattern, "--", str(EVAL_FILE))
    if not added:
        return None
    parents = _git("log", "-1", "--format=%P", added.split()[0]).split()
    return parents[0] if parents else None


def run_old_matcher(commit: str, items: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """Run the matcher of ``commit`` on ``items`` (in a subprocess, from a ``git archive``)."""
    with tempfile.TemporaryDirectory(prefix="rerank-history-") as temp:
        root = Path(temp)
        package = root / "gradient_doctor"
        package.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", commit], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(package)], input=archive, check=True)
        env = dict(os.environ, PYTHONPATH=str(root), GRADIENT_DOCTOR_CACHE_DIR=str(root / "c"))
        done = subprocess.run(
            [sys.executable, "-c", _RUNNER, str(rerank.DEPTH)],
            input=json.dumps([{"text": i["text"], "code": i.get("code")} for i in items]),
            capture_output=True,
            text=True,
            env=env,
            cwd=root,
        )
        if done.returncode != 0:
            print(f"  {commit[:8]}: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            return None
        results: list[dict[str, Any]] = json.loads(done.stdout)
        return results


def collect() -> None:
    items = load_items()
    groups = sorted({i.get("group", "") for i in items if blind_group(i.get("group", ""))})
    stored: list[dict[str, Any]] = []
    for group in groups:
        commit = first_look_commit(group)
        members = [i for i in items if i.get("group") == group]
        results = run_old_matcher(commit, members) if commit else None
        if results is None:
            print(f"{group}: no first-look matcher", file=sys.stderr)
            continue
        hits = [
            [c[0] for c in r["candidates"]].index(i["expect"])
            if i["expect"] in [c[0] for c in r["candidates"]]
            else -1
            for i, r in zip(members, results, strict=True)
        ]
        print(
            f"{group}: {commit[:8]} n={len(members)} first-look top-1 "
            f"{sum(h == 0 for h in hits)} top-3 {sum(0 <= h < 3 for h in hits)}"
        )
        for item, result in zip(members, results, strict=True):
            stored.append({"key": item_key(item), "group": group, "commit": commit, **result})
    raw = json.dumps(stored, separators=(",", ":"), ensure_ascii=False).encode()
    with gzip.GzipFile(HISTORY_FILE, "wb", compresslevel=9, mtime=0) as out:
        out.write(raw)  # mtime 0: the same lists give the same bytes
    print(f"wrote {len(stored)} lists to {HISTORY_FILE.relative_to(REPO)}")


# ---- the training lists -----------------------------------------------------------------------


class Lists:
    """Candidate lists as flat arrays: per list its candidate range, label and weight; per
    candidate its feature range; per feature entry its (remapped) index and value."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.meta = rows
        starts, labels, indices, values, feature_starts = [0], [], [], [], [0]
        dense_indices: set[int] = set()
        pair_keys: list[np.ndarray] = []
        target_ids: dict[int, int] = {}
        for row in rows:
            feats = rerank.candidate_features(
                row["text"], row["code"], row["candidates"], row["code_detected"]
            )
            # The (word, target) pairs this list trains: its words with its candidates' ids and
            # kinds, as word * 65536 + target number.
            words = np.array(
                rerank.text_grams(rerank.query_text(row["text"], row["code"])), dtype=np.int64
            )
            seen = {
                target_ids.setdefault(t, len(target_ids))
                for cand in row["candidates"]
                for t in rerank.target_hashes(cand)
            }
            if len(words):
                numbers = np.array(sorted(seen), dtype=np.int64)
                pair_keys.append((words[:, None] * 65536 + numbers).ravel())
            for dense, crossed in feats:
                for index, value in dense:
                    indices.append(index)
                    values.append(value)
                    dense_indices.add(index)
                indices.extend(crossed)
                values.extend([1.0] * len(crossed))
                feature_starts.append(len(indices))
            starts.append(starts[-1] + len(feats))
            ids = [c.id for c in row["candidates"]]
            labels.append(ids.index(row["expect"]) if row["expect"] in ids else -1)
        self.starts = np.array(starts)
        self.labels = np.array(labels)
        self.raw_indices = np.array(indices, dtype=np.int64)
        self.values = np.array(values)
        self.feature_starts = np.array(feature_starts)
        self.dense = dense_indices
        self.targets = np.array(sorted(target_ids, key=target_ids.__getitem__), dtype=np.int64)
        self.pairs = np.unique(np.concatenate(pair_keys)) if pair_keys else np.zeros(0, np.int64)

    def subset(self, keep: Sequence[bool]) -> Lists:
        return Lists([row for row, k in zip(self.meta, keep, strict=True) if k])


def current_lists(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Today's matcher's top candidates for each item (the re-ranker switched off)."""
    from gradient_doctor.knowledge.matcher import match

    rows = []
    for item in items:
        result = match(item["text"], code=item.get("code"), top_k=rerank.DEPTH)
        rows.append(
            _row(
                item,
                "today",
                result.out_of_scope,
                result.code_detected,
                [Candidate(m.id, m.kind, m.score, m.reasons) for m in result.matches],
            )
        )
    return rows


def history_lists(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stored first-look lists of the items still in the eval file (current labels)."""
    if not HISTORY_FILE.is_file():
        return []
    by_key = {item_key(i): i for i in items}
    rows = []
    with gzip.open(HISTORY_FILE, "rb") as stored_lists:
        history = json.loads(stored_lists.read())
    for stored in history:
        item = by_key.get(stored["key"])
        if item is None:
            continue
        candidates = [Candidate(c[0], c[1], float(c[2]), c[3]) for c in stored["candidates"]]
        rows.append(
            _row(item, "first-look", stored["out_of_scope"], stored["code_detected"], candidates)
        )
    return rows


def _row(
    item: dict[str, Any],
    source: str,
    out_of_scope: bool,
    code_detected: bool,
    candidates: list[Candidate],
) -> dict[str, Any]:
    group = item.get("group", "")
    return {
        "text": item["text"],
        "code": item.get("code"),
        "expect": item["expect"],
        "group": group,
        "round": ROUNDS.get(group, group) if blind_group(group) else "early",
        "source": source,
        "out_of_scope": out_of_scope,
        "code_detected": code_detected,
        "candidates": candidates,
    }


# ---- the model ---------------------------------------------------------------------------------


def train(lists: Lists, l2_dense: float, l2_crossed: float, today_weight: float) -> rerank.Model:
    """Minimise the weighted softmax loss over each list's candidates plus the L2 penalties."""
    used, remapped = np.unique(lists.raw_indices, return_inverse=True)
    penalty = np.where(np.isin(used, list(lists.dense)), l2_dense, l2_crossed)
    has_label = lists.labels >= 0
    # Lists whose answer is out of scope and were called so are the matcher's verdict; lists
    # without the answer among the candidates teach nothing.
    trainable = has_label & ~np.array([r["out_of_scope"] for r in lists.meta], dtype=bool)
    weight = np.array([today_weight if r["source"] == "today" else 1.0 for r in lists.meta])
    weight = np.where(trainable, weight, 0.0)
    n_cands = int(lists.starts[-1])
    list_of_cand = np.repeat(np.arange(len(lists.meta)), np.diff(lists.starts))
    cand_of_entry = np.repeat(np.arange(n_cands), np.diff(lists.feature_starts))
    target = np.zeros(n_cands)
    target[(lists.starts[:-1] + np.maximum(lists.labels, 0))[trainable]] = 1.0
    values = lists.values

    def loss_and_grad(w: np.ndarray) -> tuple[float, np.ndarray]:
        s = np.bincount(cand_of_entry, weights=w[remapped] * values, minlength=n_cands)
        top = np.maximum.reduceat(s, lists.starts[:-1])
        e = np.exp(s - top[list_of_cand])
        z = np.add.reduceat(e, lists.starts[:-1])
        p = e / z[list_of_cand]
        log_p_target = np.add.reduceat(target * (s - top[list_of_cand]), lists.starts[:-1])
        loss = float(np.sum(weight * (np.log(z) - log_p_target)))
        g_cand = weight[list_of_cand] * (p - target)
        grad = np.bincount(remapped, weights=g_cand[cand_of_entry] * values, minlength=len(used))
        loss += 0.5 * float(np.sum(penalty * w * w))
        return loss, grad + penalty * w

    w = _lbfgs(loss_and_grad, np.zeros(len(used)), ITERATIONS)
    return Trained(lists, used, w)


class Trained:
    """A trained weight vector over the indices ``used``, turned into a :class:`rerank.Model`
    (weights at most ``keep`` in size dropped: they change little and cost load time)."""

    def __init__(self, lists: Lists, used: np.ndarray, w: np.ndarray) -> None:
        self.lists, self.used, self.w = lists, used, w

    def model(self, keep: float = KEEP_ABOVE, digits: int | None = None) -> rerank.Model:
        def rounded(value: float) -> float:
            return round(value, digits) if digits is not None else value

        weight_of = dict(zip(self.used.tolist(), self.w.tolist(), strict=True))
        dense = {
            i: rounded(weight_of[i])
            for i in sorted(self.lists.dense)
            if abs(weight_of.get(i, 0.0)) > keep
        }
        # The (word, target) pairs some training list had, crossed as rerank._cross does (a
        # pair that only shares a hashed index with them is a collision, not a weight).
        grams, numbers = self.lists.pairs // 65536, self.lists.pairs % 65536
        crossed = ((grams * 1000003) ^ self.lists.targets[numbers]) & ((1 << rerank.BITS) - 1)
        slot = np.searchsorted(self.used, crossed).clip(0, len(self.used) - 1)
        value = np.where(self.used[slot] == crossed, self.w[slot], 0.0)
        table: dict[int, dict[int, float]] = {}
        for k in np.nonzero(np.abs(value) > keep)[0]:
            table.setdefault(int(grams[k]), {})[int(numbers[k])] = rounded(float(value[k]))
        positions = {int(target): p for p, target in enumerate(self.lists.targets.tolist())}
        return rerank.Model(dense, positions, table)


def _lbfgs(f: Any, x: np.ndarray, iterations: int, memory: int = 10) -> np.ndarray:
    """Plain L-BFGS with a backtracking (Armijo) line search: deterministic, numpy only."""
    loss, grad = f(x)
    s_hist: list[np.ndarray] = []
    y_hist: list[np.ndarray] = []
    for _ in range(iterations):
        q = grad.copy()
        alphas = []
        for s, y in zip(reversed(s_hist), reversed(y_hist), strict=True):
            a = float(s @ q) / float(y @ s)
            alphas.append(a)
            q -= a * y
        if s_hist:
            q *= float(s_hist[-1] @ y_hist[-1]) / float(y_hist[-1] @ y_hist[-1])
        for (s, y), a in zip(zip(s_hist, y_hist, strict=True), reversed(alphas), strict=True):
            b = float(y @ q) / float(y @ s)
            q += (a - b) * s
        direction = -q
        slope = float(grad @ direction)
        if slope >= 0:
            direction, slope = -grad, -float(grad @ grad)
        step = 1.0 if s_hist else 1.0 / max(1.0, float(np.sqrt(grad @ grad)))
        while True:
            new_x = x + step * direction
            new_loss, new_grad = f(new_x)
            if new_loss <= loss + 1e-4 * step * slope or step < 1e-10:
                break
            step *= 0.5
        s_new, y_new = new_x - x, new_grad - grad
        if float(s_new @ y_new) > 1e-10:
            s_hist.append(s_new)
            y_hist.append(y_new)
            if len(s_hist) > memory:
                s_hist.pop(0)
                y_hist.pop(0)
        converged = abs(loss - new_loss) < 1e-7 * max(1.0, abs(loss))
        x, loss, grad = new_x, new_loss, new_grad
        if converged:
            break
    return x


def ranks(
    rows: list[dict[str, Any]], model: rerank.Model | None, floor: float = rerank.FLOOR
) -> list[int]:
    """Where each list's answer lands (-1: not among the candidates; an out-of-scope answer
    counts only when the list says out of scope), with the re-ranker or without (None)."""
    out = []
    for row in rows:
        cands = row["candidates"]
        order = list(range(len(cands)))
        if model is not None and not row["out_of_scope"]:
            order = rerank.order(
                row["text"], row["code"], cands, row["code_detected"], model, floor
            )
        ids = [cands[i].id for i in order]
        rank = ids.index(row["expect"]) if row["expect"] in ids else -1
        if rank == 0 and row["expect"] == "out-of-scope" and not row["out_of_scope"]:
            rank = 1
        out.append(rank)
    return out


def summary(found: list[int]) -> str:
    n = len(found)
    top1 = sum(r == 0 for r in found)
    top3 = sum(0 <= r < 3 for r in found)
    return f"top-1 {top1}/{n} {top1 / max(n, 1):.1%}  top-3 {top3}/{n} {top3 / max(n, 1):.1%}"


# ---- commands ----------------------------------------------------------------------------------


def all_rows() -> list[dict[str, Any]]:
    items = load_items()
    return current_lists(items) + history_lists(items)


def cross_validate(
    by: str,
    l2_dense: float,
    l2_crossed: float,
    today_weight: float,
    floors: Sequence[float],
    keeps: Sequence[float],
    dump: Path | None = None,
) -> None:
    rows = all_rows()
    lists = Lists(rows)
    folds = sorted({r[by] for r in rows if blind_group(r["group"])})
    held: dict[str, list[tuple[int, int]]] = {"today": [], "first-look": []}
    by_floor: dict[tuple[str, float], list[int]] = {}
    by_keep: dict[tuple[str, float], list[int]] = {}
    dumped: list[dict[str, Any]] = []
    for fold in folds:
        trained = train(
            lists.subset([r[by] != fold for r in rows]), l2_dense, l2_crossed, today_weight
        )
        model = trained.model()
        for source in held:
            part = [r for r in rows if r[by] == fold and r["source"] == source]
            held[source].extend(zip(ranks(part, None), ranks(part, model), strict=True))
            for floor in floors:
                by_floor.setdefault((source, floor), []).extend(ranks(part, model, floor))
            for keep in keeps:
                pruned = trained.model(keep)
                by_keep.setdefault((source, keep), []).extend(ranks(part, pruned))
        if dump is not None:
            part = [r for r in rows if r[by] == fold]
            for row, before, after in zip(part, ranks(part, None), ranks(part, model), strict=True):
                order = rerank.order(
                    row["text"], row["code"], row["candidates"], row["code_detected"], model
                )
                dumped.append(
                    {
                        "group": row["group"],
                        "source": row["source"],
                        "expect": row["expect"],
                        "text": row["text"],
                        "code": row["code"],
                        "matcher": before,
                        "re-ranked": after,
                        "ids": [row["candidates"][i].id for i in order],
                    }
                )
        part = [r for r in rows if r[by] == fold and r["source"] == "first-look"]
        print(
            f"  {fold:8s} first-look n={len(part):3d} matcher "
            f"{sum(r == 0 for r in ranks(part, None)):3d}  re-ranked "
            f"{sum(r == 0 for r in ranks(part, model)):3d}",
            flush=True,
        )
    for source, pairs in held.items():
        print(f"held-out {source:10s} matcher alone: {summary([a for a, _ in pairs])}")
        print(f"held-out {source:10s} + re-ranker:  {summary([b for _, b in pairs])}")
        for floor in floors:
            found = by_floor[(source, floor)]
            print(f"held-out {source:10s} + re-ranker, floor {floor}: {summary(found)}")
        for keep in keeps:
            found = by_keep[(source, keep)]
            print(f"held-out {source:10s} + re-ranker, keep > {keep}: {summary(found)}")
    if dump is not None:
        dump.write_text(json.dumps(dumped, indent=1, ensure_ascii=False) + "\n")


def fingerprint() -> str:
    """A digest of the features of a fixed query: written with the weights, checked by a test,
    so that a change to the extractor without a new ``rerank.VERSION`` cannot go unnoticed."""
    candidates = [
        Candidate("loss-nan", "symptom", 40.0, ["words: nan, loss", "phrases: 'loss nan'"]),
        Candidate("amp-diverges", "symptom", 22.5, ["text: fails only in fp16", "code: x"]),
        Candidate("lower-lr-for-nan", "rationalization", 5.0, ["close to: 'x' (0.61)", "typo"]),
    ]
    text = "My fp16 loss is NaN at step 12k; should I lower the LR?\nscaler.step(opt)"
    rows = rerank.candidate_features(text, "loss.backward()", candidates, True)
    # Sorted: the order in which the extractor lists a candidate's features changes no weight.
    canonical = [(sorted(dense), sorted(crossed)) for dense, crossed in rows]
    return hashlib.sha256(repr(canonical).encode()).hexdigest()[:16]


def write_weights() -> None:
    started = time.perf_counter()
    rows = all_rows()
    model = train(Lists(rows), L2_DENSE, L2_CROSSED, TODAY_WEIGHT).model(KEEP_ABOVE, 4)
    for source in ("today", "first-look"):
        part = [r for r in rows if r["source"] == source]
        print(f"{source:10s} in-sample matcher {summary(ranks(part, None))}")
        print(f"{source:10s} in-sample re-ranked {summary(ranks(part, model))}")
    data = {
        "version": rerank.VERSION,
        "bits": rerank.BITS,
        "trained_on": f"{EVAL_FILE.relative_to(REPO)}, {HISTORY_FILE.relative_to(REPO)}",
        "fingerprint": fingerprint(),
        "hyper": {"l2_dense": L2_DENSE, "l2_crossed": L2_CROSSED, "today_weight": TODAY_WEIGHT},
        "dense_index": list(model.dense),
        "dense_weight": list(model.dense.values()),
        "targets": sorted(model.targets, key=model.targets.__getitem__),
        "grams": list(model.crossed),
        "pairs": [[x for pair in t.items() for x in pair] for t in model.crossed.values()],
    }
    WEIGHTS_FILE.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    size = len(model.dense) + sum(len(t) for t in model.crossed.values())
    print(
        f"wrote {size} weights ({len(model.crossed)} words) to "
        f"{WEIGHTS_FILE.relative_to(REPO)} in {time.perf_counter() - started:.0f} s"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("collect", help="store the first-look lists from the git history")
    sub.add_parser("train", help="rewrite knowledge/data/rerank.json")
    cv = sub.add_parser("cv", help="held-out scores, one group or round out at a time")
    cv.add_argument("--by", choices=("group", "round"), default="round")
    cv.add_argument("--l2-dense", type=float, default=L2_DENSE)
    cv.add_argument("--l2-crossed", type=float, default=L2_CROSSED)
    cv.add_argument("--today-weight", type=float, default=TODAY_WEIGHT)
    cv.add_argument(
        "--floors", default="0,0.1,0.2,0.3", help="also report these floors (rerank.FLOOR)"
    )
    cv.add_argument(
        "--keeps", default="0.003,0.03,0.05", help="also report these KEEP_ABOVE prunings"
    )
    cv.add_argument("--dump", type=Path, help="write each held-out list's ranks (JSON) here")
    args = parser.parse_args(argv)
    if args.command == "collect":
        collect()
    elif args.command == "train":
        write_weights()
    else:
        floors = [float(f) for f in args.floors.split(",") if f]
        keeps = [float(k) for k in args.keeps.split(",") if k]
        cross_validate(
            args.by, args.l2_dense, args.l2_crossed, args.today_weight, floors, keeps, args.dump
        )


if __name__ == "__main__":
    main()
