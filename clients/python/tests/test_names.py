"""The kit's names: a distribution and an import package that no PyPI project
uses, so that `pip install` and `import` can only ever mean this kit.

PyPI's `redis-ratelimit` (1.0.3, 2018) is another project whose import name is
`redis_ratelimit`: an example saying `pip install redis-ratelimit` installed it,
and `pip install -U` replaced this kit with it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import redis_ratelimit_client

KIT = Path(__file__).resolve().parents[1]
DOCS = KIT.parents[1] / "docs" / "clients.md"
#: Names PyPI gives to other projects (normalized as PEP 503 does).
TAKEN = {"redis-ratelimit"}


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_distribution_and_the_import_package_are_not_pypis_redis_ratelimit() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((KIT / "pyproject.toml").read_text())["project"]
    assert normalized(project["name"]) == "redis-ratelimit-client"
    assert normalized(project["name"]) not in TAKEN
    assert redis_ratelimit_client.__name__ == "redis_ratelimit_client"
    assert [p.name for p in (KIT / "src").iterdir() if (p / "__init__.py").exists()] == [
        "redis_ratelimit_client"
    ]


def pip_installs(text: str) -> list[str]:
    """The requirements named on every `pip install` line of a text."""
    names = []
    for line in text.splitlines():
        m = re.search(r"pip install (.*)", line)
        if m:
            words = m.group(1).split("#")[0].split()
            names += [w.strip("'\"") for w in words if not w.startswith("-")]
    return names


def test_no_example_or_guide_installs_another_projects_redis_ratelimit() -> None:
    texts = [p.read_text() for p in sorted((KIT / "examples").glob("*.py"))]
    texts += [(KIT / "README.md").read_text(), DOCS.read_text()]
    for text in texts:
        for req in pip_installs(text):
            name = re.split(r"[\[<>=!~;@ ]", req)[0]
            assert normalized(name) not in TAKEN, f"`pip install {req}` installs another project"
