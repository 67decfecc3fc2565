"""The two steps of ``plan()`` that measure (the machine profile before TorchRec's loop,
the verification after it) and where the machine's models come from.
"""
