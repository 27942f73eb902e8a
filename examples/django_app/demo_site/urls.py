"""The example's URLs: the page, starting an import, its result, the JS client, sign-out."""

from django.contrib.auth.views import LogoutView
from django.urls import path
from progress_demo import views

from livepush.contrib.django.views import client_js

urlpatterns = [
    path("", views.index, name="index"),
    path("start/", views.start, name="start"),
    path("result/<str:result_id>/", views.result, name="result"),
    path("livepush.js", client_js, name="livepush-js"),
    path("logout/", LogoutView.as_view(next_page="/"), name="logout"),
]
