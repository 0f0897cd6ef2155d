"""`python -m services.telephony`: run the telephony service."""

import sys

from services.telephony.server import main

sys.exit(main())
