"""MCP prompts (clients show them as slash commands): check-gradients, triage, review-training-loop.

Each prompt tells the assistant which tools to call, how to present what they return, and
which tempting claims not to make (the rationalization entries, with what to say instead).

The same workflows are written out as the plugin's slash-command files (``commands/*.md`` for
Claude Code, ``commands/*.toml`` for Gemini CLI): :func:`slash_commands` gives their text with
the host's argument placeholder, and ``skill_server.plugin_files`` writes them, so a command
file and the MCP prompt of the same name cannot say different things.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from mcp.server import MCPServer
from pydantic import Field

#: Rationalizations most likely to replace a real diagnosis, quoted in every prompt.
GUARDED_CLAIMS = (
    "lower-lr-for-nan",
    "switch-optimizer",
    "clipping-is-a-hack",
    "clip-anywhere",
    "amp-breaks-clipping",
    "gradients-are-mysterious",
    "model-too-complex",
    "nan-means-bad-data",
)

#: Where the whole rationalization table is, for the MCP prompts.
_TABLE_AS_RESOURCE = (
    "The full table is the resource gradient-doctor://rationalizations; "
    "match_symptoms flags these claims when the user makes them."
)

#: One line per prompt: the MCP prompt's description and the command file's ``description``.
DESCRIPTIONS = {
    "check-gradients": (
        "Diagnose a training script: static red flags, a short probed run, and the fixes."
    ),
    "triage": "Map a described training symptom to the likely gradient causes and next checks.",
    "review-training-loop": ("Review pasted training-loop code for gradient-management mistakes."),
}
TITLES = {
    "check-gradients": "Check gradient health of a training script",
    "triage": "Triage a training symptom",
    "review-training-loop": "Review a pasted training loop",
}


def do_not_say(table_pointer: str = _TABLE_AS_RESOURCE) -> str:
    """The guarded claims as a Markdown list, each with what to say instead."""
    from gradient_doctor.knowledge import load_knowledge

    kb = load_knowledge()
    lines = []
    for claim_id in GUARDED_CLAIMS:
        entry = kb.entries.get(claim_id)
        if entry is None or entry.kind != "rationalization":
            continue
        lines.append(f'- Not "{entry.claim}" — instead: {" ".join(entry.say_instead.split())}')
    lines.append(f"- {table_pointer}")
    return "\n".join(lines)


def presentation() -> str:
    """How to show a tool's report to the user."""
    return (
        "Present the result as the tool's Gradient Health Report: keep its Summary table "
        "with the ✅/⚠️/❌ marks, list each issue with its catalogue id, severity and the "
        "line or layer it points at, then the recommendations and the code. Show patches as "
        "unified diffs and say the user's file was not changed; offer to apply the patch. "
        "Quote numbers from the tools, never invent them."
    )


# --- the workflows, shared by the MCP prompts and the command files ---------------------------


def check_gradients_steps(script: str, described: str) -> str:
    """The check-gradients steps; ``script`` names the script, ``described`` the symptoms."""
    return (
        f"1. Call the `diagnose` tool with path={script}{described}. It reads the "
        "script, runs it for a few optimizer steps under the gradient probe, and merges "
        "both with the described symptom. If the script needs command-line arguments (a "
        "required option of its argument parser, a data path), pass them as args, the way "
        "its README or launch command runs it.\n"
        "2. If the probe could not run (status script-error, timeout, no-training-loop, "
        "out-of-memory or execution disabled), say so plainly, show the script's last output "
        "if given, and rely on the static findings: they are not a clean bill of health. "
        "Call `diagnose` again only once the cause is fixed (missing arguments: add them).\n"
        "3. If the report has a patch and the probe ran, prove the patch before offering it: "
        "call `diagnose` again with the same path and verify=true (a patched copy and the "
        "original run side by side; the user's file is not touched) and report its "
        "Verification verdict. Never offer a patch whose verdict is broken or worse.\n"
        "4. For each critical issue that neither the patch nor the report's Code to Add "
        "covers, call `get_fix` with its snippet id (or the issue's own id) and the user's "
        "variable names (model, optimizer, loss, scaler, accumulation steps) read from the "
        "script.\n"
        "5. Use `explain` on an id when the user asks why.\n"
    )


def triage_steps(symptoms: str) -> str:
    """The triage steps for the reported ``symptoms`` (or a reference to them)."""
    return (
        f"1. Call `match_symptoms` with {symptoms}. If it says the question is out of scope "
        "(learning-rate-only, data-only or the job's plumbing such as checkpoint resume "
        "or a slow data loader), say so and give its pointer instead of "
        "gradient advice.\n"
        "2. Otherwise, take the top matches in order: name each likely cause by its id, "
        "say how to confirm it (its next checks), and what to do about it. When a match "
        "is a rationalization the user voiced, answer with its 'say instead'.\n"
        "3. Ask for the training script (or its path) and offer to run `diagnose` on it: "
        "a symptom alone does not prove a cause.\n"
        "4. Offer fix code with `get_fix` using the user's names.\n"
    )


def review_steps(source: str) -> str:
    """The review steps; ``source`` says what to hand to ``lint_script``."""
    return (
        f"1. Call `lint_script` with {source}. Report every finding "
        "with its id, severity and line, and show the combined diff.\n"
        "2. Check the order of calls yourself against the rule: zero_grad → forward → "
        "backward (loss divided by the accumulation steps) → unscale_ (with a GradScaler) "
        "→ clip → step → scheduler step → zero_grad, and say which lines break it.\n"
        "3. A static read cannot see norms: if the user has the script, offer "
        "`probe_script` or `diagnose` to measure what the gradients do.\n"
        "4. For fixes not covered by a diff, call `get_fix` with the names used in the "
        "code.\n"
    )


def check_gradients_text(script_path: str, symptoms: str | None) -> str:
    """The check-gradients prompt for one script."""
    described = f' with description="{symptoms.strip()}"' if symptoms and symptoms.strip() else ""
    return (
        f"Check the gradient health of `{script_path}`.\n\n"
        f"{check_gradients_steps(f'`{script_path}`', described)}\n"
        f"{presentation()}\n\nDo not say:\n{do_not_say()}\n"
    )


def triage_text(symptoms: str) -> str:
    """The triage prompt for a described symptom."""
    return (
        f"The user reports: {symptoms.strip()}\n\n"
        f"{triage_steps('this text')}\n"
        f"Do not say:\n{do_not_say()}\n"
    )


def review_text(code: str) -> str:
    """The review prompt for pasted code."""
    return (
        "Review this PyTorch training loop for gradient-management mistakes.\n\n"
        f"```python\n{code.rstrip()}\n```\n\n"
        f"{review_steps('source set to exactly this code')}\n"
        f"{presentation()}\n\nDo not say:\n{do_not_say()}\n"
    )


# --- the same workflows as slash-command files ------------------------------------------------


@dataclass(frozen=True)
class SlashCommand:
    """A command file's content, host-neutral: ``{args}`` stands for the user's arguments."""

    name: str
    description: str
    argument_hint: str
    #: Markdown; ``{args}`` is replaced by the host's placeholder (``$ARGUMENTS``, ``{{args}}``).
    body: str

    def render(self, placeholder: str) -> str:
        """The body with the host's argument placeholder."""
        return self.body.replace("{args}", placeholder)


def slash_commands(cli_fallback: dict[str, str]) -> list[SlashCommand]:
    """The three workflows as slash commands.

    ``cli_fallback`` maps a command name to the Markdown that says how to do the same with the
    ``gradient-doctor`` CLI when the MCP tools are absent (written by ``plugin_files`` from the
    real CLI parser).
    """
    table = "`gradient-doctor explain rationalizations` prints the full table of such claims."
    check = SlashCommand(
        name="check-gradients",
        description=DESCRIPTIONS["check-gradients"],
        argument_hint="[script.py] [symptoms...]",
        body=(
            "# Check gradient health\n\n"
            "Arguments: `{args}`\n\n"
            "The first argument that names a `.py` file is the training script; any other "
            "words are the user's description of what goes wrong. When no script is named, "
            "find the training script in this project (a file that calls `.backward()` and "
            "an optimizer's `.step()`), and ask the user when more than one fits.\n\n"
            + check_gradients_steps(
                "that script",
                " and description set to the user's words about what goes wrong (if any)",
            )
            + f"\n{presentation()}\n\nDo not say:\n{do_not_say(table)}\n\n"
            + cli_fallback["check-gradients"]
        ),
    )
    triage = SlashCommand(
        name="triage",
        description=DESCRIPTIONS["triage"],
        argument_hint="<symptoms, e.g. loss goes NaN after 2k steps with AMP>",
        body=(
            "# Triage a training symptom\n\n"
            "The user reports: {args}\n\n"
            "When that is empty, ask what they observe (loss values, when it starts, AMP, "
            "accumulation, DDP) before anything else.\n\n"
            + triage_steps("the user's words as the text")
            + f"\nDo not say:\n{do_not_say(table)}\n\n"
            + cli_fallback["triage"]
        ),
    )
    review = SlashCommand(
        name="review-training-loop",
        description=DESCRIPTIONS["review-training-loop"],
        argument_hint="[training_script.py | pasted code]",
        body=(
            "# Review a training loop\n\n"
            "Arguments: `{args}`\n\n"
            "If that names a file, review that file; if it is code, review that code; if it "
            "is empty, review the training loop the user last showed or pointed at in this "
            "conversation, and ask for it when there is none.\n\n"
            + review_steps(
                "path set to the file, or source set to exactly the pasted code (never an "
                "edited version)"
            )
            + f"\n{presentation()}\n\nDo not say:\n{do_not_say(table)}\n\n"
            + cli_fallback["review-training-loop"]
        ),
    )
    return [check, triage, review]


def register(server: MCPServer) -> None:
    """Add the three prompts to ``server``."""

    @server.prompt(
        name="check-gradients",
        title=TITLES["check-gradients"],
        description=DESCRIPTIONS["check-gradients"],
    )
    def check_gradients(
        script_path: Annotated[str, Field(description="Path of the training script to check.")],
        symptoms: Annotated[
            str | None, Field(description="Optional: what goes wrong, in your words.")
        ] = None,
    ) -> str:
        return check_gradients_text(script_path, symptoms)

    @server.prompt(name="triage", title=TITLES["triage"], description=DESCRIPTIONS["triage"])
    def triage(
        symptoms: Annotated[
            str, Field(description="What the user observes, e.g. 'loss goes NaN at step 2k'.")
        ],
    ) -> str:
        return triage_text(symptoms)

    @server.prompt(
        name="review-training-loop",
        title=TITLES["review-training-loop"],
        description=DESCRIPTIONS["review-training-loop"],
    )
    def review_training_loop(
        code: Annotated[str, Field(description="The training-loop code, pasted.")],
    ) -> str:
        return review_text(code)
