"""What the interpreter reports: a problem found while executing a launch (shared by the state,
the sanitizer, the ordering model and the opcode table, so none of them imports another for it)."""


class Finding(Exception):
    """A problem found while executing; launch adds the line, CTA and thread to it."""

    def __init__(self, what, thread, sanitizer=True):
        super().__init__(what)
        self.what = what
        self.thread = int(thread)      # index within the wave
        self.sanitizer = sanitizer
