from node.cli import main

raise SystemExit(main())
