"""The docs say what the code does: doctests run, every contract value and setting is documented."""

from __future__ import annotations

import doctest
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from celery_ladder.settings import SETTINGS
from kombu_ladder import contract
from kombu_ladder.cli import build_parser
from kombu_ladder.plan import MAX_DELAY

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def page(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(p.name for p in DOCS.glob("*.rst") if ">>>" in p.read_text()))
def test_doctests_in_the_pages_pass(name: str) -> None:
    result = doctest.testfile(str(DOCS / name), module_relative=False, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0, f"{result.failed} doctest(s) failed in docs/{name}"


def test_how_it_works_has_the_contracts_worked_examples() -> None:
    text = page("how.rst")
    # The 4 h and 90 s examples are checked by the doctests; the tables must agree with them.
    assert text.count("``acemq.schedule.1h``") >= 4
    assert text.count("``acemq.schedule.10s``") >= 3


def _string_constants() -> dict[str, str]:
    return {name: getattr(contract, name) for name in contract.__all__
            if isinstance(getattr(contract, name), str)}


@pytest.mark.parametrize("name", sorted(_string_constants()))
def test_contract_page_names_every_contract_value(name: str) -> None:
    assert f"``{_string_constants()[name]}``" in page("contract.rst") or \
        f"``{_string_constants()[name]}" in page("contract.rst"), f"contract.{name} is not on the contract page"


@pytest.mark.parametrize("seconds", contract.RUNGS)
def test_contract_page_lists_every_rung_with_its_ttl(seconds: int) -> None:
    text = page("contract.rst")
    row = re.search(rf"``{re.escape(contract.rung_name(seconds))}``\n\s+- .*``x-message-ttl`` = ``(\d+)``", text)
    assert row is not None, f"no row for {contract.rung_name(seconds)}"
    assert int(row.group(1)) == contract.arguments_for(seconds)["x-message-ttl"]


def test_contract_page_lists_the_prefetch_and_the_maximum_delay() -> None:
    text = page("contract.rst")
    assert f"prefetch of {contract.PREFETCH}" in text
    assert MAX_DELAY == 3653 * 24 * 3600 and "ten years by default" in text


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_configuration_reference_names_every_setting_default_and_django_name(setting: str) -> None:
    default, django_name = SETTINGS[setting]
    text = page("configuration.rst")
    row = re.search(rf"^``{setting}``\n\s+:Django name: ``{django_name}``\n\s+:Default: ``(\w+)``", text, re.M)
    assert row is not None, f"{setting} / {django_name} is missing from the configuration reference"
    assert row.group(1) == repr(default)


def test_configuration_reference_names_every_kombu_ladder_command_and_option() -> None:
    text = page("configuration.rst")
    parser = build_parser()
    options = [opt for action in parser._actions for opt in action.option_strings if opt.startswith("--")]
    subparsers = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for command, sub in subparsers.choices.items():
        assert f"``{command}" in text, f"kombu-ladder {command} is not documented"
        options += [opt for action in sub._actions for opt in action.option_strings if opt.startswith("--")]
    missing = sorted({opt for opt in options if opt != "--help" and opt not in text})
    assert not missing, f"undocumented kombu-ladder options: {missing}"


def test_the_diagram_svg_is_made_from_its_source_and_shows_every_queue() -> None:
    source = (DOCS / "diagrams" / "ladder.dot").read_text()
    svg = (DOCS / "_static" / "ladder.svg").read_text().replace("&#45;", "-")
    for name in [*contract.rung_names(), contract.CONTROL, contract.PARKING, contract.EXCHANGE]:
        assert name in source and name in svg, name
    # Every label in the source is in the committed SVG: it was regenerated after the last edit.
    labels = {part for label in re.findall(r'label="([^"]*)"', source) for part in label.split("\\n") if part}
    missing = sorted(label for label in labels if label.replace("&", "&amp;").replace("<", "&lt;") not in svg)
    assert not missing, f"docs/_static/ladder.svg is stale, run 'make diagrams': {missing}"


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz is not installed")
def test_make_diagrams_reproduces_the_committed_svg(tmp_path: Path) -> None:
    out = tmp_path / "ladder.svg"
    subprocess.run(["dot", "-Tsvg", str(DOCS / "diagrams" / "ladder.dot"), "-o", str(out)], check=True, timeout=60)

    def shapes(svg: str) -> list[str]:
        return re.findall(r"<text[^>]*>([^<]*)</text>", svg)

    assert shapes(out.read_text()) == shapes((DOCS / "_static" / "ladder.svg").read_text())


def test_the_version_lives_in_one_place_and_the_changelog_has_it() -> None:
    from kombu_ladder import __version__

    assert "version = attr: kombu_ladder.__version__" in (ROOT / "setup.cfg").read_text()
    assert f"## [{__version__}]" in (ROOT / "CHANGELOG.md").read_text()


@pytest.mark.parametrize("package", ["kombu_ladder", "celery_ladder"])
def test_both_packages_ship_py_typed(package: str) -> None:
    assert (ROOT / package / "py.typed").is_file()
    assert re.search(rf"^\s*{package} = py\.typed$", (ROOT / "setup.cfg").read_text(), re.M)
