import sys

from kame_cli.main import main

sys.exit(main())
