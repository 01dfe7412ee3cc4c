"""Validates generated texts against their JSON schemas, independently of
shardlm (python3-jsonschema, Draft 2020-12, formats checked).
  usage: validate.py CASES.jsonl  -- lines of {"name", "schema", "text"}
Prints one line per failure and exits 1 if any text is not valid JSON or
does not validate."""
import json
import sys

import jsonschema

def main():
    failures = 0
    n = 0
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    with open(sys.argv[1], encoding="utf-8") as f:
        for line in f:
            case = json.loads(line)
            n += 1
            try:
                value = json.loads(case["text"])
            except json.JSONDecodeError as e:
                failures += 1
                print(f"FAIL {case['name']}: not JSON ({e}): {case['text']!r}")
                continue
            validator = jsonschema.Draft202012Validator(case["schema"], format_checker=checker)
            errors = list(validator.iter_errors(value))
            if errors:
                failures += 1
                print(f"FAIL {case['name']}: {errors[0].message}: {case['text']!r}")
    print(f"{n - failures}/{n} texts validate")
    return 1 if failures or n == 0 else 0

if __name__ == "__main__":
    sys.exit(main())
