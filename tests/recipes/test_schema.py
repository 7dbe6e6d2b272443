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


GOOD = sorted((RECIPES.parent / "tests" / "recipes" / "good").glob("*.json"))


@pytest.mark.parametrize("path", GOOD, ids=[p.stem for p in GOOD])
def test_test_recipes_the_parser_takes_match_schema(path):
    errors = list(jsonschema.Draft202012Validator(SCHEMA).iter_errors(json.loads(path.read_text())))
    assert not errors, "; ".join(f"/{'/'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_schema_bounds_match_the_parser():
    # Each of these the parser refuses (tests/recipes/bad, bad_recipes_test.cpp): the schema too.
    v = jsonschema.Draft202012Validator(SCHEMA)
    base = json.loads((RECIPES / "float8_block_scaling.json").read_text())
    rule = next(r for r in base["roles"] if isinstance(r["rowwise"].get("scaling"), dict))

    def refused(edit):
        bad = json.loads(json.dumps(base))
        edit(next(r for r in bad["roles"] if r["match"] == rule["match"]))
        return bool(list(v.iter_errors(bad)))

    assert refused(lambda r: r["rowwise"].pop("scaling"))  # a non-identity format needs a scaling
    assert refused(lambda r: r.update(match="linear:" + "w" * 65))  # pattern parts of 1-64 characters
    assert refused(lambda r: r["rowwise"]["scaling"].update(epsilon=1e30))  # epsilon below 1e30
    # ... and takes what the parser takes: identity without a scaling, whole numbers written 128.0.
    ok = json.loads(json.dumps(base))
    r = next(r for r in ok["roles"] if r["match"] == rule["match"])
    r["rowwise"]["scaling"]["block"] = [1, 128.0]
    r["rowwise"]["scaling"]["epsilon"] = 1e29
    r.setdefault("columnwise", {})
    r["columnwise"] = {"format": "identity"}
    assert not list(v.iter_errors(ok))
