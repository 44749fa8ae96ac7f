"""Issue 40: every missing-extra hint gives the install form the README gives, the same in every hint."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kombu_ladder.cli.console import E_EXTRA
from kombu_ladder.errors import missing_extra

ROOT = Path(__file__).resolve().parents[2]

#: The README's install form, from the root of a clone (kombu-ladder is not on the package index yet).
README_FORM = re.compile(r'pip install "\.\[(\w+(?:,\w+)*)\]"')


def test_the_readme_installs_from_a_clone_in_the_form_the_hints_give() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "From the root of a clone" in readme and README_FORM.search(readme), "the README's form changed"
    hint = missing_extra("x", "celery", "celery")
    assert README_FORM.search(hint) and "from the root of a kombu-ladder clone" in hint


def test_no_hint_in_the_packages_spells_its_own_install_command() -> None:
    """Every ``pip install`` in the code comes from :func:`missing_extra`: one form, in one place."""
    spelt = [f"{path.relative_to(ROOT)}:{number}" for package in ("kombu_ladder", "celery_ladder")
             for path in sorted((ROOT / package).rglob("*.py")) if path.name != "errors.py"
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if "pip install" in line]
    assert spelt == []


@pytest.mark.parametrize("hint,extra", [
    (E_EXTRA.format(missing="uvicorn"), "web"),
    (missing_extra("celery_ladder", "celery", "celery", "celery>=5.3,<6"), "celery"),
])
def test_each_hint_names_the_extra_what_is_missing_and_the_clone_form(hint: str, extra: str) -> None:
    assert f'needs the [{extra}] extra (' in hint
    assert f'pip install ".[{extra}]" from the root of a kombu-ladder clone' in hint
    assert "kombu-ladder[" not in hint, "a name the package index does not have"
