from cpuperf.cli import main

raise SystemExit(main())
