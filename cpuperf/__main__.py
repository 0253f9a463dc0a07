from cpuperf.entry import main

raise SystemExit(main())
