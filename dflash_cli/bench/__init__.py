"""`dflash bench`: plain decoding and drafters side by side on the same prompts."""
