"""The README explains the project from inside the repository: it links docs/architecture.md and
points at nothing outside the clone (a user of the project has no ../shared)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_links_the_architecture_and_stays_inside_the_repository() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "(docs/architecture.md)" in text and (ROOT / "docs" / "architecture.md").is_file()
    assert "../" not in text, [line for line in text.splitlines() if "../" in line]
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if not re.match(r"[a-z]+://", target):
            assert (ROOT / target).exists(), f"README links {target}, which is not in the repository"


def test_architecture_doc_covers_what_a_newcomer_needs() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    for heading in ("## Layers", "## Data flow", "## Vocabulary", "## Where each cost lives", "## How to add a model",
                    "## How to add a system", "## How to add an optimizer"):
        assert heading in text, heading
    for path in re.findall(r"`((?:cli|costmodel|workloads|topologies|reference|tools)/[\w/.]+\.(?:py|yaml))`", text):
        if "NAME" not in path:  # templates: workloads/data/models/NAME.yaml
            assert (ROOT / path).exists(), f"docs/architecture.md names {path}, which does not exist"


def test_readme_catalogue_lists_what_muonsim_catalog_lists(run_cli) -> None:
    """The README's catalogue line names every model and system `muonsim catalog --json` lists (it left
    out dgx-a100, which the catalogue and the Megatron CI dataset use)."""
    import json

    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    line = text[text.index("Catalogue: models"):]
    line = line[:line.index("figures and sources")]
    catalog = json.loads(run_cli("catalog", "--json").stdout)
    for kind in ("models", "systems"):
        for entry in catalog[kind]:
            assert f"`{entry['name']}`" in line, (kind, entry["name"], line)
