"""CRDs: generated from the models, committed, structural, with the rules users rely on."""

from __future__ import annotations

import pytest
import yaml

from tpu_operator import crdgen

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "directory", crdgen.OUTPUT_DIRS, ids=lambda p: str(p.relative_to(crdgen.REPO_ROOT))
)
def test_committed_crds_match_the_models(directory):
    for name, obj in crdgen.crds().items():
        path = directory / name
        assert path.exists(), f"{path} is missing; run `tpu-operator crds --write`"
        assert path.read_text() == crdgen.render(obj), (
            f"{path} is stale; run `tpu-operator crds --write` and commit the result"
        )


def walk(node, path="$"):
    yield path, node
    for name, child in (node.get("properties") or {}).items():
        yield from walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("name", sorted(crdgen.crds()))
def test_schemas_are_structural(name):
    schema = crdgen.crds()[name]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in walk(schema):
        assert "$ref" not in node and "anyOf" not in node and "allOf" not in node, path
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), path
        assert node.get("additionalProperties") is not False, path
    spec = schema["properties"]["spec"]
    assert "description" in spec["properties"]["template"]
    assert spec["properties"]["template"]["x-kubernetes-preserve-unknown-fields"] is True


def test_job_crd_names_columns_and_status():
    crd = crdgen.crds()["tpu-operator.dev_tpujobs.yaml"]
    assert crd["spec"]["names"]["categories"] == ["tpu"]
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns[:7] == ["Phase", "Workers", "Slices", "Restarts", "Type", "Step", "Tokens/s"]
    rendered = yaml.safe_load(crdgen.render(crd))
    assert rendered == crd
