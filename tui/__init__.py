"""The Textual dashboard (`edgeinfer top`), installed as edgeinfer.tui."""
