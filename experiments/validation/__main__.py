"""`python -m experiments.validation [--quick] [--check] [--out FILE]`: see main()."""

import sys

from experiments.validation import main

sys.exit(main())
