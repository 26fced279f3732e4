from gradient_doctor.skill_server.cli import entry

entry()
