import sys

from services.oracle.server import main

sys.exit(main())
