"""Shared pytest setup: one torch thread, so CPU tests behave the same on small CI machines."""

import torch

torch.set_num_threads(1)
