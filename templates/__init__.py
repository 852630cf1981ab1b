"""PTX templates of every kernel kind, shipped inside the wheel as ptxgen.templates."""
