"""Every shipped recipe validates against recipes/recipe.schema.json (JSON Schema 2020-12), the
file each names in "$schema": the schema is the format's published contract, so a field the
parser accepts but the schema refuses (or the reverse, for shipped files) is a bug in one of them.
"""
import json
import pathlib

import jsonschema
import pytest

RECIPES = pathlib.Path(__file__).resolve().parents[2] / "recipes"
SCHEMA = json.loads((RECIPES / "recipe.schema.json").read_text())
SHIPPED = sorted(p for p in RECIPES.glob("*.json") if p.name != "recipe.schema.json")


def test_schema_is_valid():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_recipe_matches_schema(path):
    recipe = json.loads(path.read_text())
    assert recipe.get("$schema") == "./recipe.schema.json"
    errors = sorted(jsonschema.Draft202012Validator(SCHEMA).iter_errors(recipe), key=lambda e: list(e.path))
    assert not errors, "; ".join(f"/{'/'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_schema_refuses_what_the_parser_refuses():
    # A control: the schema is not vacuous (an unknown GEMM operand format and an unknown key fail).
    v = jsonschema.Draft202012Validator(SCHEMA)
    base = json.loads((RECIPES / "w8a8_int8_inference.json").read_text())
    bad = json.loads(json.dumps(base))
    bad["gemms"][0]["b_format"] = "int4"
    assert list(v.iter_errors(bad))
    bad = json.loads(json.dumps(base))
    bad["roles"][0]["rowwise"]["colour"] = "red"
    assert list(v.iter_errors(bad))
