from wakeful.demo.story import main

raise SystemExit(main())
