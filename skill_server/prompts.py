"""MCP prompts (clients show them as slash commands): check-gradients, triage, review-training-loop.

Each prompt tells the assistant which tools to call, how to present what they return, and
which tempting claims not to make (the rationalization entries, with what to say instead).
"""

from __future__ import annotations

from typing import Annotated

from mcp.server import MCPServer
from pydantic import Field

#: Rationalizations most likely to replace a real diagnosis, quoted in every prompt.
_GUARDED_CLAIMS = (
    "lower-lr-for-nan",
    "switch-optimizer",
    "clipping-is-a-hack",
    "clip-anywhere",
    "amp-breaks-clipping",
    "gradients-are-mysterious",
    "model-too-complex",
    "nan-means-bad-data",
)


def _do_not_say() -> str:
    from gradient_doctor.knowledge import load_knowledge

    kb = load_knowledge()
    lines = []
    for claim_id in _GUARDED_CLAIMS:
        entry = kb.entries.get(claim_id)
        if entry is None or entry.kind != "rationalization":
            continue
        lines.append(f'- Not "{entry.claim}" — instead: {" ".join(entry.say_instead.split())}')
    lines.append(
        "- The full table is the resource gradient-doctor://rationalizations; "
        "match_symptoms flags these claims when the user makes them."
    )
    return "\n".join(lines)


def _presentation() -> str:
    return (
        "Present the result as the tool's Gradient Health Report: keep its Summary table "
        "with the ✅/⚠️/❌ marks, list each issue with its catalogue id, severity and the "
        "line or layer it points at, then the recommendations and the code. Show patches as "
        "unified diffs and say the user's file was not changed; offer to apply the patch. "
        "Quote numbers from the tools, never invent them."
    )


def register(server: MCPServer) -> None:
    """Add the three prompts to ``server``."""

    @server.prompt(name="check-gradients", title="Check gradient health of a training script")
    def check_gradients(
        script_path: Annotated[str, Field(description="Path of the training script to check.")],
        symptoms: Annotated[
            str | None, Field(description="Optional: what goes wrong, in your words.")
        ] = None,
    ) -> str:
        """Diagnose a training script: static red flags, a short probed run, and the fixes."""
        described = (
            f' with description="{symptoms.strip()}"' if symptoms and symptoms.strip() else ""
        )
        return (
            f"Check the gradient health of `{script_path}`.\n\n"
            f"1. Call the `diagnose` tool with path=`{script_path}`{described}. It reads the "
            "script, runs it for a few optimizer steps under the gradient probe, and merges "
            "both with the described symptom.\n"
            "2. If the probe could not run (status script-error, timeout, no-training-loop or "
            "execution disabled), say so plainly, show the script's last output if given, and "
            "rely on the static findings; call `probe_script` again only if the user fixes "
            "the cause.\n"
            "3. For each critical issue, call `get_fix` with its snippet id and the user's "
            "variable names (model, optimizer, loss, scaler, accumulation steps) read from the "
            "script, unless the report's patch already covers it.\n"
            "4. Use `explain` on an id when the user asks why.\n\n"
            f"{_presentation()}\n\nDo not say:\n{_do_not_say()}\n"
        )

    @server.prompt(name="triage", title="Triage a training symptom")
    def triage(
        symptoms: Annotated[
            str, Field(description="What the user observes, e.g. 'loss goes NaN at step 2k'.")
        ],
    ) -> str:
        """Map a described training symptom to the likely gradient causes and next checks."""
        return (
            f"The user reports: {symptoms.strip()}\n\n"
            "1. Call `match_symptoms` with this text. If it says the question is out of scope "
            "(learning-rate-only or data-only), say so and give its pointer instead of "
            "gradient advice.\n"
            "2. Otherwise, take the top matches in order: name each likely cause by its id, "
            "say how to confirm it (its next checks), and what to do about it. When a match "
            "is a rationalization the user voiced, answer with its 'say instead'.\n"
            "3. Ask for the training script (or its path) and offer to run `diagnose` on it: "
            "a symptom alone does not prove a cause.\n"
            "4. Offer fix code with `get_fix` using the user's names.\n\n"
            f"Do not say:\n{_do_not_say()}\n"
        )

    @server.prompt(name="review-training-loop", title="Review a pasted training loop")
    def review_training_loop(
        code: Annotated[str, Field(description="The training-loop code, pasted.")],
    ) -> str:
        """Review pasted training-loop code for gradient-management mistakes."""
        return (
            "Review this PyTorch training loop for gradient-management mistakes.\n\n"
            f"```python\n{code.rstrip()}\n```\n\n"
            "1. Call `lint_script` with source set to exactly this code. Report every finding "
            "with its id, severity and line, and show the combined diff.\n"
            "2. Check the order of calls yourself against the rule: zero_grad → forward → "
            "backward (loss divided by the accumulation steps) → unscale_ (with a GradScaler) "
            "→ clip → step → scheduler step → zero_grad, and say which lines break it.\n"
            "3. A static read cannot see norms: if the user has the script, offer "
            "`probe_script` or `diagnose` to measure what the gradients do.\n"
            "4. For fixes not covered by a diff, call `get_fix` with the names used in the "
            "code.\n\n"
            f"{_presentation()}\n\nDo not say:\n{_do_not_say()}\n"
        )
