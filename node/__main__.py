from node.ops.cli import main

raise SystemExit(main())
