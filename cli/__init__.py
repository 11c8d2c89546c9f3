"""Every command-line entry point (`kvscope`, `generate`, `bench`, `roofline`, ...) and the
rich printing the headless commands use. Nothing below `cli` imports it."""
