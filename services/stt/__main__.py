"""`python -m services.stt`: run the STT service."""

import sys

from services.stt.server import main

sys.exit(main())
