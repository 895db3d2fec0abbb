"""ringtrain.backends"""
