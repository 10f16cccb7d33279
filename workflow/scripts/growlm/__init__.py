"""growlm: grow a large GPT-2 from several small trained ones, and measure whether it pays."""

from growlm.errors import GrowlmError

__all__ = ["GrowlmError"]
__version__ = "0.1.0"
