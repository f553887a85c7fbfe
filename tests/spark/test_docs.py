"""docs/spark.md and the README's Spark section run, as written, against a live gateway
(in this test session's SparkSession, which `getOrCreate()` hands back)."""

from __future__ import annotations

import contextlib
import io
import re
from typing import Any

import pytest

from tests.services import REPO_ROOT
from tests.spark.conftest import LakeGateway

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def _run(code: str, lake: LakeGateway) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = code.replace("http://127.0.0.1:8080", lake.gateway.http_url)
        code = code.replace("127.0.0.1:50051", lake.gateway.grpc_target)
        exec(compile(code, "doc", "exec"), {})
    return out.getvalue()


def test_spark_docs_run(lake: LakeGateway, tg_spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    assert lake.gateway.api_key is not None
    monkeypatch.setenv("TIDEGATE_API_KEY", lake.gateway.api_key)
    # The guide's snippets in order, as one program (the later ones use the first's names).
    snippets = re.findall(r"```python\n(.*?)```", (REPO_ROOT / "docs/spark.md").read_text(), re.S)
    assert len(snippets) == 2
    printed = _run("\n".join(snippets), lake)
    assert "| /buy|340|" in printed and "|/home|120|" in printed and "|/home| 80|" not in printed
    assert printed.splitlines()[-3:] == ["3", "3", "6"]

    readme = (REPO_ROOT / "README.md").read_text().split("## Spark", 1)[1].split("\n## ", 1)[0]
    (snippet,) = re.findall(r"```python\n(.*?)```", readme, re.S)
    with lake.gateway.client() as c:  # the README's table, as its "Use it" section makes it
        c.create_table("shop.events", {"kind": "string", "n": "int64"}, partitions=1)
        c.append("shop.events", [{"kind": "view", "n": 1}, {"kind": "buy", "n": 2}])
    printed = _run(snippet, lake)
    assert "| buy|  2|" in printed and "view" not in printed
