"""The series: the apply engine, the applied checkout it leaves, the AST assertions, and new
patches taken in."""
