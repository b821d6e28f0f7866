"""gym: one agent plays the environments (kernel.env) its data rows name, in-process or on an
environment server; see README.md."""
