"""ringtrain.engine"""
