"""The series: the apply engine, the applied checkout it leaves, and the AST assertions."""
