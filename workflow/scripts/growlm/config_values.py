"""The config's values as the schema reads them: values from the command line turned into the
schema's types (`coerce`), and the schema's problems, one line each (`schema_problems`).

Torch-free: the workflow runs both while Snakemake parses the Snakefile (`growlm.validate.check_config`).
"""


from __future__ import annotations

import difflib
import re

import jsonschema
import yaml

from growlm.methods import OPERATORS


# ----------------------------------------------------------------------------------------------
# command-line values as the schema's types
# ----------------------------------------------------------------------------------------------

def _parse_scalar(text: str):
    """'32' -> 32, '1e6' -> 1000000.0, 'true' -> True, '[32, 64]' -> [32, 64], 'msg' -> 'msg'."""
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


# a YAML tag where a node starts: at the start of a value, after [ { , or after a mapping key's ": "
_TAG = re.compile(r"(?:^|[\[{,]|:\s)\s*(!\S*?)(?=[\s\[\]{},]|$)")


def config_tag_problems(argv: list[str]) -> list[str]:
    """A YAML tag in a `--config` value (`!!python/tuple [1]`, `!!str 5`), one line each. Snakemake reads
    those values with YAML's base loader, which drops every tag and keeps what follows: the tag is not
    what the run gets (a Python object's tag becomes a list or a string that the checks after it were never
    meant to see). Snakemake strips the quotes around a whole value first, so quoting it does not help."""
    entries, i = [], 1
    while i < len(argv):
        word = argv[i]
        i += 1
        if word.startswith("--config="):
            entries.append(word.partition("=")[2])
        elif word in ("--config", "-C"):
            while i < len(argv) and not argv[i].startswith("-"):
                entries.append(argv[i])
                i += 1
    out = []
    for entry in entries:
        key, _, value = entry.partition("=")
        tag = _TAG.search(value.strip("'\""))  # as Snakemake reads it (without its outer quotes, then as YAML)
        if tag:
            out.append(f"--config {entry!r}: {tag.group(1)} is a YAML tag, which --config does not read (Snakemake "
                       f"drops it and keeps what follows); give {key} its value itself, without a tag")
    return out


def _types(schema: dict) -> set[str]:
    t = schema.get("type", ())
    return {t} if isinstance(t, str) else set(t)


def coerce(value, schema: dict, defs: dict):
    """`value` turned into what `schema` asks for where it can be (a copy; the original otherwise)."""
    if "$ref" in schema:
        schema = {**defs[schema["$ref"].rpartition("/")[2]], **{k: v for k, v in schema.items() if k != "$ref"}}
    for key in ("oneOf", "anyOf"):
        if key in schema:
            for option in schema[key]:
                candidate = coerce(value, option, defs)
                if _valid(candidate, option, defs):
                    return candidate
            return value
    types = _types(schema)
    if isinstance(value, str) and types & {"integer", "number", "boolean", "null", "array", "object"}:
        parsed = _parse_scalar(value)
        if not isinstance(parsed, str):
            value = parsed
    if types == {"string"} and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)  # a name that reads as a number (2024, nan) in YAML or on the command line: its text
    if isinstance(value, float) and "integer" in types and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and "number" in types and "integer" not in types:
        value = float(value)
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        return {k: coerce(v, props[k], defs) if k in props else (coerce(v, extra, defs) if isinstance(extra, dict)
                                                                 else v) for k, v in value.items()}
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [coerce(v, schema["items"], defs) for v in value]
    return value


def _valid(value, schema: dict, defs: dict) -> bool:
    return jsonschema.Draft202012Validator({**schema, "$defs": defs}).is_valid(value)


def coerce_options(options: dict) -> dict:
    """`grow.options` values as the types of each operator's defaults ('0.1' -> 0.1, '100' -> 100)."""
    out = {}
    for name, opts in options.items():
        spec = OPERATORS.get(name)
        if spec is None or not isinstance(opts, dict):
            out[name] = opts
            continue
        fixed = {}
        for key, value in opts.items():
            default = spec.options.get(key)
            if isinstance(value, str) and (default is None or isinstance(default, (bool, int, float))):
                parsed = _parse_scalar(value)
                value = parsed if default is None or type(parsed) in (type(default), int) else value
            if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            fixed[key] = value
        out[name] = fixed
    return out


# ----------------------------------------------------------------------------------------------
# the schema, one line per problem
# ----------------------------------------------------------------------------------------------

def _values(schema: dict, defs: dict) -> str:
    """The values a (sub)schema allows, in words: 'an integer >= 1', "'gstack'", 'a list of ...'."""
    if "$ref" in schema:
        schema = defs[schema["$ref"].rpartition("/")[2]]
    if "const" in schema:
        return repr(schema["const"])
    if "enum" in schema:
        return "one of " + ", ".join(map(str, schema["enum"]))
    if "oneOf" in schema:
        return " or ".join(v for v in (_values(s, defs) for s in schema["oneOf"]) if v)
    types = sorted(_types(schema))
    if types == ["array"] and "items" in schema:
        return f"a list of ({_values(schema['items'], defs)})"
    if types == ["string"] and "pattern" in schema:  # the rule a name follows, not just its type
        return f"a string matching the pattern {schema['pattern']}"
    bounds = [f"> {schema['exclusiveMinimum']}" if "exclusiveMinimum" in schema else None,
              f">= {schema['minimum']}" if "minimum" in schema else None,
              f"< {schema['exclusiveMaximum']}" if "exclusiveMaximum" in schema else None,
              f"<= {schema['maximum']}" if "maximum" in schema else None]
    return " ".join(x for x in ["/".join(types), *[b for b in bounds if b]] if x)


def _hint(schema: dict, defs: dict) -> str:
    """What would work, from the (sub)schema: allowed values or range, the description, the default."""
    if "$ref" in schema:
        schema = defs[schema["$ref"].rpartition("/")[2]]
    parts = [_values(schema, defs)]
    if schema.get("description"):
        parts.append(str(schema["description"]).strip())
    if "default" in schema:
        parts.append(f"default {schema['default']!r}")
    return "; ".join(p for p in parts if p)


def _key(path) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(the config)"


def _repeated(values: list) -> list:
    """The values that occur more than once in `values`, in order of first occurrence."""
    seen, out = [], []
    for v in values:
        if v in seen and v not in out:
            out.append(v)
        seen.append(v)
    return out


# keys that growlm once read, with what replaced them: such a key gets this line, not "unknown key"
REMOVED = {
    "grow.optimizer_state": "removed: the carry-over of the members' AdamW moments is the `carry` refinement "
                            "operator now; put it in the method's chain (methods: [[msg, carry]])",
}


def schema_problems(config: dict, schema: dict) -> list[str]:
    """Every place where `config` breaks `schema`, as 'key = value: what is wrong; what would work'."""
    defs = schema.get("$defs", {})
    validator = jsonschema.Draft202012Validator(schema)
    problems = []
    for err in sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path))):
        where = _key(err.absolute_path)
        if err.validator == "additionalProperties":
            allowed = sorted(err.schema.get("properties", {}))
            extra = [k for k in err.instance if k not in allowed] if isinstance(err.instance, dict) else []
            for k in extra:
                key = f"{where}.{k}" if err.absolute_path else k
                if key in REMOVED:
                    problems.append(f"{key}: {REMOVED[key]}")
                    continue
                near = difflib.get_close_matches(k, allowed, n=1)
                why = f"; {err.schema['description'].strip()}" if err.schema.get("description") else ""
                problems.append(f"{key}: unknown key" + (f"; did you mean {near[0]!r}?" if near else "")
                                + f" (known here: {', '.join(allowed)}){why}")
            continue
        if err.validator == "required":
            problems.append(f"{where}: {err.message}")
            continue
        if isinstance(err.instance, list) and err.validator in ("oneOf", "minItems", "uniqueItems"):
            # command-line items arrive as text ('32'): read them as the numbers they are
            values = [_parse_scalar(v) if isinstance(v, str) else v for v in err.instance]
            repeated = _repeated(values)
            if not values:
                problems.append(f"{where} = []: an empty list; give at least one value")
                continue
            if repeated:
                problems.append(f"{where} = {values!r}: {', '.join(map(repr, repeated))} "
                                f"{'appears' if len(repeated) == 1 else 'appear'} more than once; list each value "
                                f"once (a duplicate would train the same models twice)")
                continue
        hint = _hint(err.schema, defs)
        shown = err.instance  # command-line values arrive as text ('-5'): shown as the values they are
        if isinstance(shown, str):
            shown = _parse_scalar(shown)
        elif isinstance(shown, list):
            shown = [_parse_scalar(v) if isinstance(v, str) else v for v in shown]
        problems.append(f"{where} = {shown!r}: not allowed" + (f"; expected {hint}" if hint else ""))
    return problems
