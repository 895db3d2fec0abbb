"""ringtrain.runner"""
