"""`python -m services.web`: run the web service."""

import sys

from services.web.server import main

sys.exit(main())
