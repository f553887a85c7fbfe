"""Issue 40: the Iceberg catalog's planning routes against the official REST catalog
specification (``tests/data/iceberg/rest-catalog-open-api.yaml``, apache/iceberg's own
document), not the gateway's description of itself.

Schemathesis makes requests of ``planTableScan``, ``fetchPlanningResult``,
``cancelPlanning``, ``fetchScanTasks`` and the reads an engine makes before it plans
(``loadTable``, the lists, ``/v1/config``) from the specification, positive and negative,
half of them on the real table and with a real plan id, and checks every answer as the
specification describes it: a status code it lists for the operation, its content type,
its response schema, never a 5xx. The specification's paths carry an optional
``{prefix}``; the catalog serves none (``/v1/config`` gives no ``prefix`` override), so it
is taken out of the paths. One schema is read as the specification means it:
``PrimitiveTypeValue`` is a ``oneOf`` of value types several of which any JSON integer
matches (int, long, float, double), so no integer (a ``_partition`` value, a bound) could
ever be valid under it; it is checked as ``anyOf``. The budget is
``TIDEGATE_FUZZ_EXAMPLES`` per operation group.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, seed
from hypothesis import strategies as st

from tests.hostile.conftest import Tenant
from tests.hostile.test_fuzz import COUNTS, FUZZ, alive, fuzz_tenant  # noqa: F401 - fixture

pytestmark = pytest.mark.integration

SPEC = Path(__file__).resolve().parent.parent / "data" / "iceberg" / "rest-catalog-open-api.yaml"

PLANNING = ["planTableScan", "fetchPlanningResult", "cancelPlanning", "fetchScanTasks"]
READS = ["getConfig", "listNamespaces", "loadNamespaceMetadata", "listTables", "loadTable"]


def spec_without_prefix() -> dict[str, Any]:
    """The specification with its paths as the catalog serves them: no ``{prefix}``."""
    doc: dict[str, Any] = yaml.safe_load(SPEC.read_text())
    paths = {}
    for path, item in doc["paths"].items():
        params = item.get("parameters", [])
        prefix = "#/components/parameters/prefix"
        item["parameters"] = [p for p in params if p.get("$ref") != prefix]
        paths[path.replace("/{prefix}", "")] = item
    doc["paths"] = paths
    primitive = doc["components"]["schemas"]["PrimitiveTypeValue"]
    primitive["anyOf"] = primitive.pop("oneOf")
    doc["servers"] = [{"url": "/iceberg"}]
    return doc


def spec_cases(t: Tenant, real: dict[str, Any], operations: list[str]) -> st.SearchStrategy[Any]:
    import schemathesis

    schema = schemathesis.openapi.from_dict(spec_without_prefix())
    chosen = schema.include(operation_id=operations)
    modes = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
    return st.one_of(
        *(chosen.as_strategy(mode) for mode in modes),
        *(chosen.as_strategy(mode, path_parameters=real) for mode in modes),
    )


def check_against_the_spec(case: Any, t: Tenant) -> None:
    from schemathesis.checks import (
        content_type_conformance,
        not_a_server_error,
        response_schema_conformance,
        status_code_conformance,
    )

    headers = {"authorization": f"Bearer {t.key}"}
    r = case.call(base_url=f"{t.gw.http_url}/iceberg", headers=headers, timeout=30)
    COUNTS["iceberg-spec"] += 1
    case.validate_response(
        r,
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
        ],
    )


def real_plan_id(t: Tenant) -> str:
    with t.http() as http:
        r = http.post("/iceberg/v1/namespaces/app/tables/ev/plan", json={})
        assert r.status_code == 200, r.text
        return str(r.json()["plan-id"])


def test_planning_routes_conform_to_the_specification(fuzz_tenant: Tenant) -> None:  # noqa: F811
    t = fuzz_tenant
    real = {"namespace": "app", "table": "ev", "plan-id": real_plan_id(t)}

    @seed(4040)
    @FUZZ
    @given(case=spec_cases(t, real, PLANNING))
    def run(case: Any) -> None:
        check_against_the_spec(case, t)

    run()
    alive(t)


def test_an_engines_reads_before_planning_conform_to_the_specification(
    fuzz_tenant: Tenant,  # noqa: F811
) -> None:
    t = fuzz_tenant

    @seed(4041)
    @FUZZ
    @given(case=spec_cases(t, {"namespace": "app", "table": "ev"}, READS))
    def run(case: Any) -> None:
        check_against_the_spec(case, t)

    run()
    alive(t)
