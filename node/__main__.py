import sys

try:
    from node.ops.cli import main
except ModuleNotFoundError as exc:  # a Python without the project's dependencies
    # `python -m node` from the checkout with the system's Python: say what to
    # run instead of a traceback (the virtualenv is what `make run` made).
    print(
        f"python -m node: {exc.name} is not installed for {sys.executable}: run `make run` "
        "once, then use .venv/bin/scheduler (or `. .venv/bin/activate` and `scheduler`)",
        file=sys.stderr,
    )
    raise SystemExit(2) from None

raise SystemExit(main())
