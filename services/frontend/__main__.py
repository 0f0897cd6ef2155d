"""`python -m services.frontend`: run the frontend service."""

import sys

from services.frontend.server import main

sys.exit(main())
