# vramlab report: gnuplot accuracy.gp in this folder re-renders accuracy.png
if (!exists("vl_png")) vl_png = 'accuracy.png'
set terminal png size 900,480 noenhanced
set output vl_png
set title 'Held-out pixel accuracy per epoch (run scale, same images per rung; before, ckpt and relu_off coincide)'
set xlabel 'epoch'
set ylabel 'pixel accuracy'
set grid
set key right bottom
plot 'accuracy.dat' index 0 using 1:2 with linespoints lw 2 title 'before', 'accuracy.dat' index 1 using 1:2 with linespoints lw 2 title 'ckpt', 'accuracy.dat' index 2 using 1:2 with linespoints lw 2 title 'relu_off', 'accuracy.dat' index 3 using 1:2 with linespoints lw 2 title 'accum', 'accuracy.dat' index 4 using 1:2 with linespoints lw 2 title 'amp', 'accuracy.dat' index 5 using 1:2 with linespoints lw 2 title 'loader', 'accuracy.dat' index 6 using 1:2 with linespoints lw 2 title 'after'
