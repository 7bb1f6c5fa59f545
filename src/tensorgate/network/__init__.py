"""Front ends on the event loop: HTTP today; loop selection. Never imports torch directly."""
